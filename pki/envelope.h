#pragma once

// Signatures over agent/v1 signing inputs (proto/signing_input.h builds the input for each
// purpose). A verifier never re-encodes: it verifies the exact bytes it was given.

#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "base/mutex.h"
#include "bettercompute/common/v1/common.pb.h"
#include "pki/keys.h"
#include "pki/x509.h"

namespace bcd::pki {

// Signs `signing_input` with `key` (raw, low-S) and names it `kid`, carrying `chain_der` (leaf
// first) when the verifier needs a chain.
absl::StatusOr<bettercompute::common::v1::Signature> Sign(
    std::string_view signing_input, const PrivateKey& key, std::string_view kid,
    const std::vector<std::string>& chain_der = {});

// OK when `signature` verifies over `signing_input` with the pinned `key`.
absl::Status VerifyWithKey(std::string_view signing_input,
                           const bettercompute::common::v1::Signature& signature,
                           const PublicKey& key);

// OK when the signature's chain (leaf first) leads to one of `anchors` at `now` and the leaf's key
// verifies the signature over `signing_input`. The chain is verified in full every time.
absl::Status VerifyWithChain(std::string_view signing_input,
                             const bettercompute::common::v1::Signature& signature,
                             const std::vector<Certificate>& anchors, int64_t now);

// VerifyWithChain for a stream of signatures by the same few chains (a control plane signs every
// command with the same worker chain, and verifying it with X509_verify_cert costs far more than
// the signature). It remembers chains that verified, by sha256 of (chain, anchors); an entry holds
// only while `now` is inside every certificate's validity (chain and anchors), so a hit decides
// exactly what a full verification would; there is no revocation to miss (the trust bundle's
// roots are part of the key). At most 64 entries; cleared when full. Thread-safe. One per owner
// (the dispatcher, the desired state): nothing is shared across the process.
class ChainVerifier {
 public:
  absl::Status Verify(std::string_view signing_input,
                      const bettercompute::common::v1::Signature& signature,
                      const std::vector<Certificate>& anchors, int64_t now);

 private:
  struct Entry {
    PublicKey leaf;
    int64_t not_before, not_after;
  };
  Mutex mu_;
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bcd::pki
