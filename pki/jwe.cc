#include "pki/jwe.h"

#include <openssl/core_names.h>

#include "fmt/format.h"
#include "pki/base64url.h"
#include "pki/jose_util.h"
#include "pki/openssl_util.h"
#include "proto/absl_compat.h"
#include "proto/signing_input.h"

namespace bcd::pki {
namespace {

using nlohmann::json;

constexpr std::string_view kAlg = "ECDH-ES+A256KW";
constexpr std::string_view kEnc = "A256GCM";
constexpr std::size_t kMaxHeaderBytes = 8192;

absl::Status Refuse(std::string message) {
  return absl::InvalidArgumentError("JWE refused: " + message);
}

const unsigned char* U(std::string_view s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}
unsigned char* U(std::string& s) { return reinterpret_cast<unsigned char*>(s.data()); }

// Concat KDF (NIST SP 800-56A) as RFC 7518 §4.6.2 uses it, with empty apu and apv.
absl::StatusOr<std::string> DeriveKek(std::string_view shared_secret) {
  std::string other = proto::Uint32Be(static_cast<uint32_t>(kAlg.size())) + std::string(kAlg) +
                      proto::Uint32Be(0) + proto::Uint32Be(0) + proto::Uint32Be(256);
  EvpKdfPtr kdf(EVP_KDF_fetch(nullptr, "SSKDF", nullptr));
  EvpKdfCtxPtr ctx(kdf ? EVP_KDF_CTX_new(kdf.get()) : nullptr);
  std::string digest = "SHA256";
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest.data(), 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, const_cast<char*>(shared_secret.data()),
                                        shared_secret.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, other.data(), other.size()),
      OSSL_PARAM_construct_end()};
  std::string kek(32, '\0');
  if (!ctx || EVP_KDF_derive(ctx.get(), U(kek), kek.size(), params) != 1) {
    return absl::InternalError("Concat KDF failed: " + OpenSslError());
  }
  return kek;
}

// AES-256 key wrap (RFC 3394) in either direction.
absl::StatusOr<std::string> KeyWrap(std::string_view kek, std::string_view in, bool wrap) {
  EvpCipherPtr cipher(EVP_CIPHER_fetch(nullptr, "AES-256-WRAP", nullptr));
  EvpCipherCtxPtr ctx(EVP_CIPHER_CTX_new());
  std::string out(in.size() + 8, '\0');
  int n = 0, m = 0;
  if (!cipher || !ctx ||
      EVP_CipherInit_ex2(ctx.get(), cipher.get(), U(kek), nullptr, wrap ? 1 : 0, nullptr) != 1 ||
      EVP_CipherUpdate(ctx.get(), U(out), &n, U(in), static_cast<int>(in.size())) != 1 ||
      EVP_CipherFinal_ex(ctx.get(), U(out) + n, &m) != 1) {
    OpenSslError();
    return absl::InvalidArgumentError("key unwrap failed");
  }
  out.resize(static_cast<std::size_t>(n) + static_cast<std::size_t>(m));
  return out;
}

// The protected header allows one algorithm and nothing that points elsewhere; its epk is the
// sender's ephemeral P-256 key.
absl::StatusOr<PublicKey> CheckHeader(const json& header, const JweExpectation& expect) {
  auto member = [&](std::string_view name) { return StringMember(header, name); };
  if (std::optional<std::string> alg = member("alg"); alg != kAlg) {
    return Refuse(fmt::format("alg \"{}\" is not {}", alg.value_or(""), kAlg));
  }
  if (std::optional<std::string> enc = member("enc"); enc != kEnc) {
    return Refuse(fmt::format("enc \"{}\" is not {}", enc.value_or(""), kEnc));
  }
  if (std::optional<std::string> typ = member("typ"); typ != expect.typ) {
    return Refuse(fmt::format("typ \"{}\" is not {}", typ.value_or(""), expect.typ));
  }
  for (const char* forbidden : {"zip", "crit", "jku", "jwk", "x5u", "x5c"}) {
    if (header.contains(forbidden))
      return Refuse(fmt::format("header member \"{}\" is not allowed", forbidden));
  }
  for (const char* party : {"apu", "apv"}) {
    if (header.contains(party) && member(party) != "") {
      return Refuse(fmt::format("{} must be empty", party));
    }
  }
  auto epk = header.find("epk");
  if (epk == header.end() || StringMember(*epk, "kty") != "EC" ||
      StringMember(*epk, "crv") != "P-256") {
    return Refuse("epk is not an EC P-256 JWK");
  }
  std::optional<std::string> x_text = StringMember(*epk, "x"), y_text = StringMember(*epk, "y");
  std::optional<std::string> x = x_text ? Base64UrlDecode(*x_text) : std::nullopt;
  std::optional<std::string> y = y_text ? Base64UrlDecode(*y_text) : std::nullopt;
  if (!x || !y) return Refuse("epk x or y is not base64url");
  absl::StatusOr<PublicKey> ephemeral = PublicKey::FromXY(*x, *y);
  if (!ephemeral.ok()) return Refuse("epk is not a point on P-256");
  return ephemeral;
}

// AES-256-GCM with the protected header as additional data; an error when it does not
// authenticate.
absl::StatusOr<std::string> Decrypt(const std::string& cek, const std::string& iv,
                                    std::string_view aad, const std::string& ciphertext,
                                    const std::string& tag) {
  EvpCipherCtxPtr ctx(EVP_CIPHER_CTX_new());
  std::string plaintext(ciphertext.size(), '\0');
  int n = 0, m = 0;
  if (EVP_DecryptInit_ex2(ctx.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_IVLEN, 12, nullptr) != 1 ||
      EVP_DecryptInit_ex2(ctx.get(), nullptr, U(cek), U(iv), nullptr) != 1 ||
      EVP_DecryptUpdate(ctx.get(), nullptr, &n, U(aad), static_cast<int>(aad.size())) != 1 ||
      EVP_DecryptUpdate(ctx.get(), U(plaintext), &n, U(ciphertext),
                        static_cast<int>(ciphertext.size())) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, 16, const_cast<char*>(tag.data())) !=
          1 ||
      EVP_DecryptFinal_ex(ctx.get(), U(plaintext) + n, &m) != 1) {
    OpenSslError();
    return Refuse("it does not authenticate (tampered)");
  }
  plaintext.resize(static_cast<std::size_t>(n) + static_cast<std::size_t>(m));
  return plaintext;
}

// Checked after authentication: the header is now known to come from the sender.
absl::Status CheckBindings(const json& header, const JweExpectation& expect) {
  for (const auto& [name, value] : expect.bindings) {
    std::optional<std::string> got = StringMember(header, name);
    if (got != value) {
      return Refuse(fmt::format("{} \"{}\" does not match the request's \"{}\"", name,
                                got.value_or(""), value));
    }
  }
  auto exp = header.find("exp");
  if (exp == header.end() || !exp->is_number_integer())
    return Refuse("exp is missing or not an integer");
  if (exp->get<int64_t>() <= expect.now) {
    return Refuse(fmt::format("it expired at {} (now {})", exp->get<int64_t>(), expect.now));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> OpenJwe(std::string_view compact, const PrivateKey& recipient,
                                    const JweExpectation& expect) {
  if (compact.size() > kMaxJweBytes) {
    return Refuse(fmt::format("{} bytes is over the bound of {}", compact.size(), kMaxJweBytes));
  }
  std::vector<std::string_view> parts = SplitCompact(compact);
  if (parts.size() != 5)
    return Refuse(fmt::format("a compact JWE has 5 parts, got {}", parts.size()));
  std::optional<std::string> header_text = Base64UrlDecode(parts[0]);
  std::optional<json> header =
      header_text ? ParseJsonObject(*header_text, kMaxHeaderBytes) : std::nullopt;
  if (!header) return Refuse("the protected header is not base64url of a JSON object");
  absl::StatusOr<PublicKey> ephemeral = CheckHeader(*header, expect);
  if (!ephemeral.ok()) return ephemeral.status();
  std::optional<std::string> wrapped = Base64UrlDecode(parts[1]);
  std::optional<std::string> iv = Base64UrlDecode(parts[2]);
  std::optional<std::string> ciphertext = Base64UrlDecode(parts[3]);
  std::optional<std::string> tag = Base64UrlDecode(parts[4]);
  if (!wrapped || !iv || !ciphertext || !tag) return Refuse("a part is not base64url");
  if (wrapped->size() != 40 || iv->size() != 12 || tag->size() != 16) {
    return Refuse(
        fmt::format("encrypted key, iv and tag must be 40, 12 and 16 bytes, got {}, {}, {}",
                    wrapped->size(), iv->size(), tag->size()));
  }
  absl::StatusOr<std::string> shared = recipient.Ecdh(*ephemeral);
  if (!shared.ok()) return Refuse("ECDH with epk failed");
  absl::StatusOr<std::string> kek = DeriveKek(*shared);
  if (!kek.ok()) return kek.status();
  absl::StatusOr<std::string> cek = KeyWrap(*kek, *wrapped, false);
  if (!cek.ok() || cek->size() != 32) {
    return Refuse("the content key does not unwrap (another recipient, or tampered)");
  }
  absl::StatusOr<std::string> plaintext = Decrypt(*cek, *iv, parts[0], *ciphertext, *tag);
  if (!plaintext.ok()) return plaintext.status();
  if (absl::Status s = CheckBindings(*header, expect); !s.ok()) return s;
  return plaintext;
}

absl::StatusOr<std::string> SealJwe(
    std::string_view plaintext, const PublicKey& recipient, std::string_view typ,
    const std::vector<std::pair<std::string_view, std::string_view>>& bindings, int64_t exp) {
  absl::StatusOr<PrivateKey> ephemeral = PrivateKey::Generate();
  if (!ephemeral.ok()) return ephemeral.status();
  std::string point = ephemeral->Public().Sec1();
  json header = {{"alg", kAlg},
                 {"enc", kEnc},
                 {"typ", typ},
                 {"exp", exp},
                 {"epk",
                  {{"kty", "EC"},
                   {"crv", "P-256"},
                   {"x", Base64UrlEncode(std::string_view(point).substr(1, 32))},
                   {"y", Base64UrlEncode(std::string_view(point).substr(33, 32))}}}};
  for (const auto& [name, value] : bindings) header[std::string(name)] = value;
  std::string header_b64 = Base64UrlEncode(header.dump());
  absl::StatusOr<std::string> shared = ephemeral->Ecdh(recipient);
  if (!shared.ok()) return shared.status();
  absl::StatusOr<std::string> kek = DeriveKek(*shared);
  if (!kek.ok()) return kek.status();
  std::string cek = RandomBytes(32);
  absl::StatusOr<std::string> wrapped = KeyWrap(*kek, cek, true);
  if (!wrapped.ok()) return wrapped.status();
  std::string iv = RandomBytes(12);
  EvpCipherCtxPtr ctx(EVP_CIPHER_CTX_new());
  std::string ciphertext(plaintext.size(), '\0');
  std::string tag(16, '\0');
  int n = 0, m = 0;
  if (EVP_EncryptInit_ex2(ctx.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_IVLEN, 12, nullptr) != 1 ||
      EVP_EncryptInit_ex2(ctx.get(), nullptr, U(cek), U(iv), nullptr) != 1 ||
      EVP_EncryptUpdate(ctx.get(), nullptr, &n, U(header_b64),
                        static_cast<int>(header_b64.size())) != 1 ||
      EVP_EncryptUpdate(ctx.get(), U(ciphertext), &n, U(plaintext),
                        static_cast<int>(plaintext.size())) != 1 ||
      EVP_EncryptFinal_ex(ctx.get(), U(ciphertext) + n, &m) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, 16, tag.data()) != 1) {
    return absl::InternalError("AES-GCM encryption failed: " + OpenSslError());
  }
  return fmt::format("{}.{}.{}.{}.{}", header_b64, Base64UrlEncode(*wrapped), Base64UrlEncode(iv),
                     Base64UrlEncode(ciphertext), Base64UrlEncode(tag));
}

}  // namespace bcd::pki
