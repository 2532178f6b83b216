// Parses arbitrary bytes as PEM chains, DER certificates (and their SPIFFE identity) and CSRs.

#include <cstdint>
#include <string>

#include "pki/x509.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  if (auto chain = bcd::pki::ParsePemChain(bytes); chain.ok()) {
    for (const auto& cert : *chain) (void)bcd::pki::IdentityOf(cert);
    (void)bcd::pki::VerifyChain(*chain, {chain->back()}, 1800000000);
  }
  if (auto cert = bcd::pki::Certificate::FromDer(bytes); cert.ok()) {
    (void)bcd::pki::IdentityOf(*cert);
    (void)cert->Key();
  }
  (void)bcd::pki::VerifyCsr(bytes);
  (void)bcd::pki::SpiffeId::Parse(bytes);
  return 0;
}
