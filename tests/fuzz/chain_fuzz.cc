// Certificates, chains and CSRs from arbitrary bytes. The first byte picks the mode:
//   even  the rest as PEM chains, DER certificates (and their SPIFFE identity), CSRs and SPIFFE
//         ids; a chain never verifies against a CA made here (the input cannot have been signed
//         by its key)
//   odd   edits (position, xor) to a valid node certificate of that CA: whatever still verifies
//         says what the original says (key, SANs, validity, subject)
// Nothing may crash or leak.

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "pki/x509.h"
#include "testing/dev_pki.h"

namespace {

struct Fixture {
  bcd::testing::DevPki pki = *bcd::testing::DevPki::Create(1'700'000'000);
  bcd::pki::PrivateKey node_key = *bcd::pki::PrivateKey::Generate();
  bcd::pki::Certificate leaf = *pki.IssueNode(node_key.Public(), "n-1", 1, 1'700'000'000, 86400);
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Fixture* fixture = new Fixture;
  if (size == 0) return 0;
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::vector<bcd::pki::Certificate> anchors = {fixture->pki.node_ca()};
  if ((data[0] & 1) == 0) {
    if (auto chain = bcd::pki::ParsePemChain(bytes); chain.ok()) {
      for (const auto& cert : *chain) (void)bcd::pki::IdentityOf(cert);
      if (bcd::pki::VerifyChain(*chain, anchors, 1'700'000'100).ok()) abort();
      (void)bcd::pki::VerifyChain(*chain, {chain->back()}, 1'700'000'100);
    }
    if (auto cert = bcd::pki::Certificate::FromDer(bytes); cert.ok()) {
      (void)bcd::pki::IdentityOf(*cert);
      (void)cert->Key();
      if (bcd::pki::VerifyChain({*cert}, anchors, 1'700'000'100).ok()) abort();
    }
    (void)bcd::pki::VerifyCsr(bytes);
    (void)bcd::pki::SpiffeId::Parse(bytes);
    return 0;
  }
  std::string der = fixture->leaf.Der();
  for (std::size_t i = 0; i + 1 < bytes.size(); i += 2) {
    der[static_cast<unsigned char>(bytes[i]) * 5 % der.size()] ^= bytes[i + 1];
  }
  auto cert = bcd::pki::Certificate::FromDer(der);
  if (cert.ok() && bcd::pki::VerifyChain({*cert}, anchors, 1'700'000'100).ok()) {
    const bcd::pki::Certificate& leaf = fixture->leaf;
    if (cert->SpkiDer() != leaf.SpkiDer() || cert->UriSans() != leaf.UriSans() ||
        cert->NotBefore() != leaf.NotBefore() || cert->NotAfter() != leaf.NotAfter() ||
        cert->Subject() != leaf.Subject()) {
      abort();  // a certificate nobody issued was taken
    }
  }
  return 0;
}
