#include "pki/envelope.h"

#include <map>
#include <mutex>
#include <optional>

#include "base/mutex.h"
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
  return ChainVerifier().Verify(signing_input, signature, anchors, now);
}

absl::Status ChainVerifier::Verify(std::string_view signing_input,
                                   const bettercompute::common::v1::Signature& signature,
                                   const std::vector<Certificate>& anchors, int64_t now) {
  if (signature.chain().empty()) {
    return absl::UnauthenticatedError("the signature carries no certificate chain");
  }
  std::string identity;
  for (const std::string& der : signature.chain()) identity += Sha256(der);
  identity += '|';
  for (const Certificate& anchor : anchors) identity += Sha256(anchor.Der());
  std::string key = Sha256(identity);
  std::optional<PublicKey> remembered;
  {
    MutexLock lock(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end() && now >= it->second.not_before && now <= it->second.not_after) {
      remembered = it->second.leaf;
    }
  }
  if (remembered) return remembered->VerifyEs256(signing_input, signature.sig());
  absl::StatusOr<std::vector<Certificate>> chain =
      ParseDerChain({signature.chain().begin(), signature.chain().end()});
  if (!chain.ok()) return chain.status();
  if (absl::Status status = VerifyChain(*chain, anchors, now); !status.ok()) return status;
  absl::StatusOr<PublicKey> leaf = chain->front().Key();
  if (!leaf.ok()) return leaf.status();
  int64_t not_before = INT64_MIN, not_after = INT64_MAX;
  for (const std::vector<Certificate>* certs : {&std::as_const(*chain), &anchors}) {
    for (const Certificate& cert : *certs) {
      not_before = std::max(not_before, cert.NotBefore());
      not_after = std::min(not_after, cert.NotAfter());
    }
  }
  {
    MutexLock lock(mu_);
    if (entries_.size() >= 64) entries_.clear();
    entries_.insert_or_assign(std::move(key), Entry{*leaf, not_before, not_after});
  }
  return leaf->VerifyEs256(signing_input, signature.sig());
}

}  // namespace bcd::pki
