#include "pki/keys.h"

#include <openssl/core_names.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include <cstring>

#include "fmt/format.h"

namespace bcd::pki {
namespace {

constexpr char kGroup[] = "prime256v1";
// The order n of P-256 and n / 2.
constexpr char kOrderHex[] = "FFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551";

BignumPtr Order() {
  BIGNUM* n = nullptr;
  BN_hex2bn(&n, kOrderHex);
  return BignumPtr(n);
}

absl::Status CheckP256(EVP_PKEY* key, bool need_private) {
  if (key == nullptr) return absl::InvalidArgumentError("not a key");
  if (!EVP_PKEY_is_a(key, "EC"))
    return absl::InvalidArgumentError("not an EC key (P-256 required)");
  char group[64] = {};
  std::size_t length = 0;
  if (!EVP_PKEY_get_utf8_string_param(key, OSSL_PKEY_PARAM_GROUP_NAME, group, sizeof group,
                                      &length) ||
      std::strcmp(group, kGroup) != 0) {
    return absl::InvalidArgumentError(
        fmt::format("EC key on curve \"{}\", P-256 required", group[0] ? group : "unknown"));
  }
  EvpPkeyCtxPtr ctx(EVP_PKEY_CTX_new_from_pkey(nullptr, key, nullptr));
  int ok = need_private ? EVP_PKEY_check(ctx.get()) : EVP_PKEY_public_check(ctx.get());
  if (ok != 1) {
    return absl::InvalidArgumentError("the key's point is not on P-256: " + OpenSslError());
  }
  return absl::OkStatus();
}

}  // namespace

std::string Sha256(std::string_view bytes) {
  std::string out(SHA256_DIGEST_LENGTH, '\0');
  SHA256(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(),
         reinterpret_cast<unsigned char*>(out.data()));
  return out;
}

std::string Hex(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) out += fmt::format("{:02x}", c);
  return out;
}

std::string RandomBytes(std::size_t size) {
  std::string out(size, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(size)) != 1) {
    std::abort();  // no randomness: nothing safe can be done
  }
  return out;
}

absl::StatusOr<PublicKey> PublicKey::FromSpkiDer(std::string_view der) {
  const auto* p = reinterpret_cast<const unsigned char*>(der.data());
  EvpPkeyPtr key(d2i_PUBKEY(nullptr, &p, static_cast<long>(der.size())));
  if (!key || p != reinterpret_cast<const unsigned char*>(der.data()) + der.size()) {
    return absl::InvalidArgumentError("not a DER SubjectPublicKeyInfo: " +
                                      OpenSslError("trailing bytes"));
  }
  if (absl::Status s = CheckP256(key.get(), false); !s.ok()) return s;
  return PublicKey(std::move(key));
}

absl::StatusOr<PublicKey> PublicKey::FromPem(std::string_view pem) {
  BioPtr bio = ReadBio(pem);
  EvpPkeyPtr key(PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr));
  if (!key) return absl::InvalidArgumentError("not a PEM public key: " + OpenSslError());
  if (absl::Status s = CheckP256(key.get(), false); !s.ok()) return s;
  return PublicKey(std::move(key));
}

absl::StatusOr<PublicKey> PublicKey::FromSec1(std::string_view point) {
  if (point.size() != 65 || point[0] != 0x04) {
    return absl::InvalidArgumentError(fmt::format(
        "expected an uncompressed P-256 point of 65 bytes, got {} bytes", point.size()));
  }
  OsslParamBldPtr bld(OSSL_PARAM_BLD_new());
  OSSL_PARAM_BLD_push_utf8_string(bld.get(), OSSL_PKEY_PARAM_GROUP_NAME, kGroup, 0);
  OSSL_PARAM_BLD_push_octet_string(bld.get(), OSSL_PKEY_PARAM_PUB_KEY, point.data(), point.size());
  OsslParamPtr params(OSSL_PARAM_BLD_to_param(bld.get()));
  EvpPkeyCtxPtr ctx(EVP_PKEY_CTX_new_from_name(nullptr, "EC", nullptr));
  EVP_PKEY* raw = nullptr;
  if (!params || !ctx || EVP_PKEY_fromdata_init(ctx.get()) != 1 ||
      EVP_PKEY_fromdata(ctx.get(), &raw, EVP_PKEY_PUBLIC_KEY, params.get()) != 1) {
    OpenSslError();
    return absl::InvalidArgumentError("the point is not on P-256");
  }
  EvpPkeyPtr key(raw);
  if (absl::Status s = CheckP256(key.get(), false); !s.ok()) {
    return absl::InvalidArgumentError("the point is not on P-256");
  }
  return PublicKey(std::move(key));
}

absl::StatusOr<PublicKey> PublicKey::FromXY(std::string_view x, std::string_view y) {
  if (x.size() != 32 || y.size() != 32) {
    return absl::InvalidArgumentError(
        fmt::format("P-256 coordinates must be 32 bytes each, got {} and {}", x.size(), y.size()));
  }
  return FromSec1(std::string("\x04") + std::string(x) + std::string(y));
}

std::string PublicKey::SpkiDer() const { return SpkiDerOf(key_.get()); }

std::string PublicKey::Sec1() const {
  std::string out(65, '\0');
  std::size_t length = 0;
  EVP_PKEY_get_octet_string_param(key_.get(), OSSL_PKEY_PARAM_ENCODED_PUBLIC_KEY,
                                  reinterpret_cast<unsigned char*>(out.data()), out.size(),
                                  &length);
  out.resize(length);
  return out;
}

absl::StatusOr<std::string> Es256RawToDer(std::string_view raw) {
  if (raw.size() != 64) {
    return absl::InvalidArgumentError(
        fmt::format("an ES256 signature is 64 bytes (r || s), got {} bytes", raw.size()));
  }
  const auto* p = reinterpret_cast<const unsigned char*>(raw.data());
  BignumPtr r(BN_bin2bn(p, 32, nullptr));
  BignumPtr s(BN_bin2bn(p + 32, 32, nullptr));
  EcdsaSigPtr sig(ECDSA_SIG_new());
  if (!r || !s || !sig || ECDSA_SIG_set0(sig.get(), r.get(), s.get()) != 1) {
    return absl::InternalError("cannot build an ECDSA signature: " + OpenSslError());
  }
  r.release();
  s.release();
  unsigned char* der = nullptr;
  int length = i2d_ECDSA_SIG(sig.get(), &der);
  if (length <= 0) return absl::InternalError("cannot encode an ECDSA signature");
  std::string out(reinterpret_cast<char*>(der), static_cast<std::size_t>(length));
  OPENSSL_free(der);
  return out;
}

absl::StatusOr<std::string> Es256DerToRaw(std::string_view der) {
  const auto* p = reinterpret_cast<const unsigned char*>(der.data());
  EcdsaSigPtr sig(d2i_ECDSA_SIG(nullptr, &p, static_cast<long>(der.size())));
  if (!sig || p != reinterpret_cast<const unsigned char*>(der.data()) + der.size()) {
    OpenSslError();
    return absl::InvalidArgumentError("not a DER ECDSA signature");
  }
  const BIGNUM* r = ECDSA_SIG_get0_r(sig.get());
  const BIGNUM* s = ECDSA_SIG_get0_s(sig.get());
  std::string out(64, '\0');
  auto* o = reinterpret_cast<unsigned char*>(out.data());
  if (BN_bn2binpad(r, o, 32) != 32 || BN_bn2binpad(s, o + 32, 32) != 32) {
    return absl::InvalidArgumentError("ECDSA signature values are longer than 32 bytes");
  }
  return out;
}

absl::Status PublicKey::VerifyEs256(std::string_view message, std::string_view signature,
                                    HighS high_s) const {
  if (signature.size() != 64) {
    return absl::InvalidArgumentError(
        fmt::format("an ES256 signature is 64 bytes (r || s), got {} bytes", signature.size()));
  }
  const auto* p = reinterpret_cast<const unsigned char*>(signature.data());
  BignumPtr r(BN_bin2bn(p, 32, nullptr));
  BignumPtr s(BN_bin2bn(p + 32, 32, nullptr));
  BignumPtr n = Order();
  BignumPtr half(BN_dup(n.get()));
  BN_rshift1(half.get(), half.get());
  if (BN_is_zero(r.get()) || BN_is_zero(s.get()) || BN_cmp(r.get(), n.get()) >= 0 ||
      BN_cmp(s.get(), n.get()) >= 0) {
    return absl::InvalidArgumentError("the signature's r or s is out of range");
  }
  if (high_s == HighS::kRefuse && BN_cmp(s.get(), half.get()) > 0) {
    return absl::InvalidArgumentError("the signature is not in low-S form (s > n/2)");
  }
  absl::StatusOr<std::string> der = Es256RawToDer(signature);
  if (!der.ok()) return der.status();
  EvpMdCtxPtr ctx(EVP_MD_CTX_new());
  if (EVP_DigestVerifyInit(ctx.get(), nullptr, EVP_sha256(), nullptr, key_.get()) != 1) {
    return absl::InternalError("cannot start verification: " + OpenSslError());
  }
  int ok =
      EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(der->data()), der->size(),
                       reinterpret_cast<const unsigned char*>(message.data()), message.size());
  OpenSslError();
  if (ok != 1) return absl::UnauthenticatedError("the signature does not verify");
  return absl::OkStatus();
}

absl::StatusOr<PrivateKey> PrivateKey::Generate() {
  EvpPkeyPtr key(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", kGroup));
  if (!key) return absl::InternalError("cannot generate a P-256 key: " + OpenSslError());
  return PrivateKey(std::move(key));
}

absl::StatusOr<PrivateKey> PrivateKey::FromPem(std::string_view pem) {
  BioPtr bio = ReadBio(pem);
  EvpPkeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (!key) return absl::InvalidArgumentError("not a PEM private key: " + OpenSslError());
  if (absl::Status s = CheckP256(key.get(), true); !s.ok()) return s;
  return PrivateKey(std::move(key));
}

std::string PublicKey::ToPem() const {
  BioPtr bio(BIO_new(BIO_s_mem()));
  PEM_write_bio_PUBKEY(bio.get(), key_.get());
  return BioContents(bio.get());
}

std::string PrivateKey::ToPem() const {
  BioPtr bio(BIO_new(BIO_s_mem()));
  PEM_write_bio_PrivateKey(bio.get(), key_.get(), nullptr, nullptr, 0, nullptr, nullptr);
  return BioContents(bio.get());
}

PublicKey PrivateKey::Public() const {
  // The public half alone, so a PublicKey never carries the secret scalar.
  std::string der = SpkiDerOf(key_.get());
  const auto* p = reinterpret_cast<const unsigned char*>(der.data());
  return PublicKey(EvpPkeyPtr(d2i_PUBKEY(nullptr, &p, static_cast<long>(der.size()))));
}

absl::StatusOr<std::string> PrivateKey::SignEs256(std::string_view message) const {
  EvpMdCtxPtr ctx(EVP_MD_CTX_new());
  std::size_t length = 0;
  if (EVP_DigestSignInit(ctx.get(), nullptr, EVP_sha256(), nullptr, key_.get()) != 1 ||
      EVP_DigestSign(ctx.get(), nullptr, &length,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) != 1) {
    return absl::InternalError("cannot sign: " + OpenSslError());
  }
  std::string der(length, '\0');
  if (EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(der.data()), &length,
                     reinterpret_cast<const unsigned char*>(message.data()), message.size()) != 1) {
    return absl::InternalError("cannot sign: " + OpenSslError());
  }
  der.resize(length);
  absl::StatusOr<std::string> raw = Es256DerToRaw(der);
  if (!raw.ok()) return raw.status();
  // Normalise to low-S: s' = n - s.
  auto* o = reinterpret_cast<unsigned char*>(raw->data());
  BignumPtr s(BN_bin2bn(o + 32, 32, nullptr));
  BignumPtr n = Order();
  BignumPtr half(BN_dup(n.get()));
  BN_rshift1(half.get(), half.get());
  if (BN_cmp(s.get(), half.get()) > 0) {
    BN_sub(s.get(), n.get(), s.get());
    BN_bn2binpad(s.get(), o + 32, 32);
  }
  return raw;
}

absl::StatusOr<std::string> PrivateKey::Ecdh(const PublicKey& peer) const {
  EvpPkeyCtxPtr ctx(EVP_PKEY_CTX_new_from_pkey(nullptr, key_.get(), nullptr));
  std::size_t length = 0;
  if (!ctx || EVP_PKEY_derive_init(ctx.get()) != 1 ||
      EVP_PKEY_derive_set_peer(ctx.get(), peer.get()) != 1 ||
      EVP_PKEY_derive(ctx.get(), nullptr, &length) != 1) {
    return absl::InvalidArgumentError("ECDH failed: " + OpenSslError());
  }
  std::string secret(length, '\0');
  if (EVP_PKEY_derive(ctx.get(), reinterpret_cast<unsigned char*>(secret.data()), &length) != 1) {
    return absl::InvalidArgumentError("ECDH failed: " + OpenSslError());
  }
  secret.resize(length);
  return secret;
}

}  // namespace bcd::pki
