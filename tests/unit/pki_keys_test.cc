#include "gtest/gtest.h"
#include "pki/base64url.h"
#include "pki/keys.h"
#include "proto/absl_compat.h"
#include "tests/unit/pki_fixtures.h"

namespace bcd::pki {
namespace {

using bcd::testing::FromHex;
using bcd::testing::NodeFixtures;

std::string Message(const absl::Status& status) { return std::string(ToStd(status.message())); }

TEST(Keys, SignVerifyRoundTrip) {
  PrivateKey key = *PrivateKey::Generate();
  std::string sig = *key.SignEs256("hello");
  ASSERT_EQ(sig.size(), 64u);
  EXPECT_TRUE(key.Public().VerifyEs256("hello", sig).ok());
  absl::Status wrong = key.Public().VerifyEs256("hellO", sig);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Message(wrong), "the signature does not verify");
}

TEST(Keys, SignaturesAreAlwaysLowS) {
  PrivateKey key = *PrivateKey::Generate();
  for (int i = 0; i < 64; ++i) {
    std::string message = "m" + std::to_string(i);
    EXPECT_TRUE(key.Public().VerifyEs256(message, *key.SignEs256(message), HighS::kRefuse).ok());
  }
}

TEST(Keys, RefusesHighSUnlessAllowed) {
  const auto& sig = NodeFixtures()["signatures"][0];
  PublicKey key = *PublicKey::FromSpkiDer(FromHex(NodeFixtures()["signer_spki"]));
  std::string input = FromHex(sig["input"]);
  std::string high = FromHex(sig["high_s_sig"]);
  EXPECT_EQ(Message(key.VerifyEs256(input, high)), "the signature is not in low-S form (s > n/2)");
  EXPECT_TRUE(key.VerifyEs256(input, high, HighS::kAllow).ok());
}

TEST(Keys, RefusesSignaturesOfTheWrongLength) {
  PrivateKey key = *PrivateKey::Generate();
  std::string sig = *key.SignEs256("x");
  EXPECT_EQ(Message(key.Public().VerifyEs256("x", sig.substr(0, 63))),
            "an ES256 signature is 64 bytes (r || s), got 63 bytes");
  EXPECT_EQ(Message(key.Public().VerifyEs256("x", sig + "\x01")),
            "an ES256 signature is 64 bytes (r || s), got 65 bytes");
  EXPECT_EQ(Message(key.Public().VerifyEs256("x", std::string(64, '\0'))),
            "the signature's r or s is out of range");
}

TEST(Keys, PemAndSpkiRoundTrip) {
  PrivateKey key = *PrivateKey::Generate();
  PrivateKey again = *PrivateKey::FromPem(key.ToPem());
  EXPECT_EQ(again.Public().SpkiDer(), key.Public().SpkiDer());
  EXPECT_NE(key.ToPem().find("BEGIN PRIVATE KEY"), std::string::npos);
  PublicKey pub = *PublicKey::FromSpkiDer(key.Public().SpkiDer());
  EXPECT_EQ(pub.Sec1(), key.Public().Sec1());
  EXPECT_EQ(pub.Sec1().size(), 65u);
  EXPECT_EQ(PublicKey::FromSec1(pub.Sec1())->SpkiDer(), pub.SpkiDer());
}

TEST(Keys, LoadsAnOpensslMadeKey) {
  absl::StatusOr<PrivateKey> key = PrivateKey::FromPem(bcd::testing::Cert("node.key"));
  ASSERT_TRUE(key.ok()) << key.status();
}

TEST(Keys, RefusesPointsOffTheCurve) {
  std::string point = PrivateKey::Generate()->Public().Sec1();
  point[64] ^= 1;
  EXPECT_EQ(Message(PublicKey::FromSec1(point).status()), "the point is not on P-256");
  EXPECT_EQ(Message(PublicKey::FromSec1(point.substr(1)).status()),
            "expected an uncompressed P-256 point of 65 bytes, got 64 bytes");
}

TEST(Keys, RefusesOtherCurvesAndGarbage) {
  EvpPkeyPtr p384(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-384"));
  unsigned char* der = nullptr;
  int length = i2d_PUBKEY(p384.get(), &der);
  std::string spki(reinterpret_cast<char*>(der), length);
  OPENSSL_free(der);
  EXPECT_EQ(Message(PublicKey::FromSpkiDer(spki).status()),
            "EC key on curve \"secp384r1\", P-256 required");
  EXPECT_FALSE(PublicKey::FromSpkiDer("garbage").ok());
  EXPECT_FALSE(
      PrivateKey::FromPem("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n").ok());
}

TEST(Keys, RawAndDerSignaturesConvert) {
  PrivateKey key = *PrivateKey::Generate();
  std::string raw = *key.SignEs256("x");
  std::string der = *Es256RawToDer(raw);
  EXPECT_EQ(static_cast<unsigned char>(der[0]), 0x30);
  EXPECT_EQ(*Es256DerToRaw(der), raw);
  EXPECT_FALSE(Es256DerToRaw(der + "x").ok());
  EXPECT_FALSE(Es256RawToDer(raw.substr(1)).ok());
}

TEST(Keys, Sha256AndHex) {
  EXPECT_EQ(Hex(Sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(Base64Url, EncodesWithoutPaddingAndDecodesStrictly) {
  EXPECT_EQ(Base64UrlEncode(""), "");
  EXPECT_EQ(Base64UrlEncode("f"), "Zg");
  EXPECT_EQ(Base64UrlEncode("fo"), "Zm8");
  EXPECT_EQ(Base64UrlEncode("foo"), "Zm9v");
  EXPECT_EQ(Base64UrlEncode("\xfb\xff"), "-_8");
  EXPECT_EQ(*Base64UrlDecode("-_8"), "\xfb\xff");
  EXPECT_EQ(*Base64UrlDecode("Zm9vYg"), "foob");
  EXPECT_FALSE(Base64UrlDecode("Zg==").has_value());   // padding
  EXPECT_FALSE(Base64UrlDecode("Zm+v").has_value());   // standard alphabet
  EXPECT_FALSE(Base64UrlDecode("Z").has_value());      // impossible length
  EXPECT_FALSE(Base64UrlDecode("Zh").has_value());     // non-zero trailing bits
  EXPECT_FALSE(Base64UrlDecode("Zm 9v").has_value());  // whitespace
}

}  // namespace
}  // namespace bcd::pki
