#include "pki/envelope.h"

#include "fmt/format.h"
#include "proto/absl_compat.h"

namespace bcd::pki {

absl::StatusOr<bettercompute::common::v1::Signature> Sign(
    std::string_view signing_input, const PrivateKey& key, std::string_view kid,
    const std::vector<std::string>& chain_der) {
  absl::StatusOr<std::string> sig = key.SignEs256(signing_input);
  if (!sig.ok()) return sig.status();
  bettercompute::common::v1::Signature out;
  out.set_sig(*sig);
  out.set_kid(std::string(kid));
  for (const std::string& der : chain_der) out.add_chain(der);
  return out;
}

absl::Status VerifyWithKey(std::string_view signing_input,
                           const bettercompute::common::v1::Signature& signature,
                           const PublicKey& key) {
  return key.VerifyEs256(signing_input, signature.sig());
}

absl::Status VerifyWithChain(std::string_view signing_input,
                             const bettercompute::common::v1::Signature& signature,
                             const std::vector<Certificate>& anchors, int64_t now) {
  if (signature.chain().empty()) {
    return absl::UnauthenticatedError("the signature carries no certificate chain");
  }
  absl::StatusOr<std::vector<Certificate>> chain =
      ParseDerChain({signature.chain().begin(), signature.chain().end()});
  if (!chain.ok()) return chain.status();
  if (absl::Status status = VerifyChain(*chain, anchors, now); !status.ok()) return status;
  absl::StatusOr<PublicKey> leaf = chain->front().Key();
  if (!leaf.ok()) return leaf.status();
  return leaf->VerifyEs256(signing_input, signature.sig());
}

}  // namespace bcd::pki
