#pragma once

// X.509 certificates and chains, SPIFFE identities and CSRs.
//
// A chain is verified against an explicit set of trust anchors and nothing else: never the system
// roots. Any anchor may be a CA below a root (partial chains are allowed), because a daemon pins
// the CA that issues its peers, not whatever root sits above it. Verification time is always passed
// in.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "pki/keys.h"
#include "pki/openssl_util.h"

namespace bcd::pki {

class Certificate {
 public:
  static absl::StatusOr<Certificate> FromDer(std::string_view der);
  // Exactly one PEM certificate.
  static absl::StatusOr<Certificate> FromPem(std::string_view pem);

  const std::string& Der() const { return der_; }
  std::string Pem() const;
  std::string SpkiDer() const;
  std::string SpkiSha256() const { return Sha256(SpkiDer()); }
  // The subject key; an error when it is not P-256.
  absl::StatusOr<PublicKey> Key() const { return PublicKey::FromSpkiDer(SpkiDer()); }
  int64_t NotBefore() const;  // unix seconds
  int64_t NotAfter() const;   // unix seconds
  std::vector<std::string> UriSans() const;
  std::string Subject() const;  // one line, for messages

  X509* get() const { return cert_.get(); }

 private:
  Certificate(X509Ptr cert, std::string der) : cert_(std::move(cert)), der_(std::move(der)) {}
  std::shared_ptr<X509> cert_;
  std::string der_;
};

// Every certificate of a PEM bundle, in order; an error when there is none or one is malformed.
absl::StatusOr<std::vector<Certificate>> ParsePemChain(std::string_view pem);
// DER certificates as protocol messages carry them.
absl::StatusOr<std::vector<Certificate>> ParseDerChain(const std::vector<std::string>& der);

// OK when chain[0] (the leaf) chains through chain[1..] to one of `anchors` at `now`.
// Errors are Unauthenticated and name the reason ("certificate has expired", ...).
absl::Status VerifyChain(const std::vector<Certificate>& chain,
                         const std::vector<Certificate>& anchors, int64_t now);

// spiffe://<trust domain>/site/<site>/node/<node>
class SpiffeId {
 public:
  static absl::StatusOr<SpiffeId> Parse(std::string_view uri);
  static absl::StatusOr<SpiffeId> Make(std::string_view trust_domain, std::string_view site,
                                       std::string_view node);

  const std::string& trust_domain() const { return trust_domain_; }
  const std::string& site() const { return site_; }
  const std::string& node() const { return node_; }
  std::string ToString() const;

  friend bool operator==(const SpiffeId&, const SpiffeId&) = default;

 private:
  SpiffeId() = default;
  std::string trust_domain_, site_, node_;
};

// What a node certificate says: its one SPIFFE id, and the urn:bc: statements about its key.
struct NodeIdentity {
  SpiffeId id;
  std::optional<uint64_t> generation;  // urn:bc:generation:<n>
  bool tenant_controlled = false;      // urn:bc:tenant-controlled
};

// Exactly one SPIFFE URI SAN, else an error; urn:bc: SANs are read as statements, other URIs
// ignored.
absl::StatusOr<NodeIdentity> IdentityOf(const Certificate& certificate);

// A DER PKCS#10 CSR for `key`, subject CN=`common_name`, signed with ES256.
absl::StatusOr<std::string> CreateCsr(const PrivateKey& key, std::string_view common_name);
// The public key of a DER CSR whose self-signature verifies; an error otherwise.
absl::StatusOr<PublicKey> VerifyCsr(std::string_view der);

}  // namespace bcd::pki
