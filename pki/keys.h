#pragma once

// P-256 keys, SHA-256 and ES256. A PublicKey or PrivateKey is always a valid P-256 key: the only
// ways to get one check the curve and the point.
//
// ES256 signatures are raw r || s (64 bytes). Verification refuses a signature whose s is in the
// upper half of the group order (high-S) unless told otherwise: agent/v1 envelopes are low-S only,
// so a signature has exactly one valid encoding. JWS (tunnel tickets), made by generic JOSE
// libraries that do not normalise, allows both.

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "pki/openssl_util.h"

namespace bcd::pki {

std::string Sha256(std::string_view bytes);
std::string Hex(std::string_view bytes);  // lowercase
// Cryptographically random bytes.
std::string RandomBytes(std::size_t size);

enum class HighS { kRefuse, kAllow };

class PublicKey {
 public:
  static absl::StatusOr<PublicKey> FromSpkiDer(std::string_view der);
  static absl::StatusOr<PublicKey> FromPem(std::string_view pem);
  // Uncompressed SEC1 point: 0x04 || x || y, 65 bytes.
  static absl::StatusOr<PublicKey> FromSec1(std::string_view point);
  // JWK coordinates, 32 bytes each.
  static absl::StatusOr<PublicKey> FromXY(std::string_view x, std::string_view y);

  std::string SpkiDer() const;
  std::string Sec1() const;   // 65 bytes
  std::string ToPem() const;  // SubjectPublicKeyInfo PEM
  std::string SpkiSha256() const { return Sha256(SpkiDer()); }

  // OK when `signature` (raw r || s) is a valid ES256 signature of `message` by this key.
  absl::Status VerifyEs256(std::string_view message, std::string_view signature,
                           HighS high_s = HighS::kRefuse) const;

  EVP_PKEY* get() const { return key_.get(); }

 private:
  friend class PrivateKey;
  explicit PublicKey(EvpPkeyPtr key) : key_(std::move(key)) {}
  std::shared_ptr<EVP_PKEY> key_;
};

class PrivateKey {
 public:
  static absl::StatusOr<PrivateKey> Generate();
  // PKCS#8 or SEC1 ("EC PRIVATE KEY") PEM of a P-256 key.
  static absl::StatusOr<PrivateKey> FromPem(std::string_view pem);

  std::string ToPem() const;  // PKCS#8, unencrypted: store it 0600
  PublicKey Public() const;

  // Raw r || s over SHA-256(message), always low-S.
  absl::StatusOr<std::string> SignEs256(std::string_view message) const;
  // ECDH shared secret (the x coordinate, 32 bytes) with `peer`.
  absl::StatusOr<std::string> Ecdh(const PublicKey& peer) const;

  EVP_PKEY* get() const { return key_.get(); }

 private:
  explicit PrivateKey(EvpPkeyPtr key) : key_(std::move(key)) {}
  std::shared_ptr<EVP_PKEY> key_;
};

// Raw r || s <-> DER ECDSA-Sig-Value.
absl::StatusOr<std::string> Es256RawToDer(std::string_view raw);
absl::StatusOr<std::string> Es256DerToRaw(std::string_view der);

}  // namespace bcd::pki
