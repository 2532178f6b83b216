#pragma once

// Certificate issuance, for the dev stack's CAs and tests. bcd itself issues one certificate only:
// the throwaway root it hands gRPC so gRPC does not load the system's (transport/tls.cc).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pki/keys.h"
#include "pki/x509.h"

namespace bcd::pki {

struct CertificateSpec {
  std::string common_name;
  std::vector<std::string> uri_sans;
  std::vector<std::string> dns_sans;
  std::vector<std::string> ip_sans;
  int64_t not_before = 0;  // unix seconds
  int64_t not_after = 0;
  bool is_ca = false;
  bool client_auth = false;  // extendedKeyUsage clientAuth
  bool server_auth = false;  // extendedKeyUsage serverAuth
};

// A certificate for `subject` signed by `issuer_key`; self-signed when `issuer` is null (then
// issuer_key must be the subject's key).
absl::StatusOr<Certificate> IssueCertificate(const CertificateSpec& spec, const PublicKey& subject,
                                             const PrivateKey& issuer_key,
                                             const Certificate* issuer);

}  // namespace bcd::pki
