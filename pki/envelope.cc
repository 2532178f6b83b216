#include "pki/envelope.h"

#include <map>
#include <mutex>
#include <optional>

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

namespace {

// Chains that verified, by sha256 of (chain, anchors): a control plane signs every command with
// the same worker chain, and verifying it with X509_verify_cert costs far more than the signature.
// An entry holds only while `now` is inside every certificate's validity (chain and anchors), so a
// hit decides exactly what a full verification would; there is no revocation to miss (the trust
// bundle's roots are part of the key). Bounded; cleared when full.
class VerifiedChains {
 public:
  std::optional<PublicKey> Find(const std::string& key, int64_t now) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end() || now < it->second.not_before || now > it->second.not_after)
      return std::nullopt;
    return it->second.leaf;
  }
  void Add(std::string key, PublicKey leaf, int64_t not_before, int64_t not_after) {
    std::lock_guard<std::mutex> lock(mu_);
    if (entries_.size() >= 64) entries_.clear();
    entries_.insert_or_assign(std::move(key), Entry{std::move(leaf), not_before, not_after});
  }

 private:
  struct Entry {
    PublicKey leaf;
    int64_t not_before, not_after;
  };
  std::mutex mu_;
  std::map<std::string, Entry> entries_;
};

VerifiedChains& Cache() {
  static VerifiedChains* cache = new VerifiedChains();
  return *cache;
}

}  // namespace

absl::Status VerifyWithChain(std::string_view signing_input,
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
  if (std::optional<PublicKey> leaf = Cache().Find(key, now)) {
    return leaf->VerifyEs256(signing_input, signature.sig());
  }
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
  Cache().Add(std::move(key), *leaf, not_before, not_after);
  return leaf->VerifyEs256(signing_input, signature.sig());
}

}  // namespace bcd::pki
