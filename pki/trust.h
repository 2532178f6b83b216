#pragma once

// The trust bundle a daemon holds and the approver set it enforces.
//
// A bundle is taken only when signed by the pinned JoinService key and of a greater version. Its
// approver set is taken only by the rule of the protocol: holding set H at epoch e, take (N, e')
// when e' > e and at least H's threshold of distinct H keys signed approver-set for (e', N) — N ==
// H included; with no set yet (e = 0, H empty) the first non-empty set is taken with its bundle.
// Otherwise H and e stay and the rest of the bundle applies.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bettercompute/agent/v1/trust.pb.h"
#include "pki/keys.h"
#include "pki/x509.h"

namespace bcd::pki {

struct Approver {
  std::string kid;
  std::string spki;  // DER
  PublicKey key;
};

class ApproverSet {
 public:
  // The empty set at epoch 0: no quorum is enforced.
  ApproverSet() = default;
  // The set a bundle names, validated: P-256 keys, distinct kids and keys, thresholds between 1
  // and the number of keys.
  static absl::StatusOr<ApproverSet> FromBundle(
      const bettercompute::agent::v1::TrustBundle& bundle);

  bool empty() const { return approvers_.empty(); }
  const std::vector<Approver>& approvers() const { return approvers_; }
  uint32_t threshold() const { return threshold_; }
  uint64_t epoch() const { return epoch_; }
  uint32_t unbatched_destructive_per_hour() const { return per_hour_; }
  // approverSetInput and its sha256 (reported in Hello 19 and StatusReport 11).
  const std::string& input() const { return input_; }
  std::string Sha256() const { return pki::Sha256(input_); }

  const Approver* Find(std::string_view kid) const;
  // The threshold for a batch of `targets` commands: the tier with the largest min_targets not
  // above it, else approver_threshold.
  uint32_t ThresholdForBatch(std::size_t targets) const;
  // Same keys, thresholds, tiers and limit (the epoch is not compared).
  bool SameSetAs(const ApproverSet& other) const { return input_ == other.input_; }

 private:
  std::vector<Approver> approvers_;
  uint32_t threshold_ = 0;
  std::vector<std::pair<uint32_t, uint32_t>> tiers_;  // (min_targets, threshold)
  uint32_t per_hour_ = 0;
  uint64_t epoch_ = 0;
  std::string input_ = ApproverSetInputOfEmpty();
  static std::string ApproverSetInputOfEmpty();
};

class TrustState {
 public:
  // The first bundle (from a JoinGrant): any version, signed by the JoinService key.
  static absl::StatusOr<TrustState> FromFirstBundle(
      const bettercompute::agent::v1::SignedTrustBundle& signed_bundle,
      const PublicKey& join_service_key);

  // What a restart enforces: the newest bundle taken, with the approver set of `approver_source`
  // (the bundle the held set came from, when a later bundle's set was refused; null when the
  // newest bundle's own set is held). Both must be signed by the JoinService key, of one trust
  // domain, and the source no newer than the bundle.
  static absl::StatusOr<TrustState> Restore(
      const bettercompute::agent::v1::SignedTrustBundle& signed_bundle,
      const bettercompute::agent::v1::SignedTrustBundle* approver_source,
      const PublicKey& join_service_key);

  struct Update;
  // A newer bundle. An error refuses the whole bundle (signature, version, trust domain, malformed
  // certificates); a refused approver-set change is not an error: the update keeps the held set
  // and says why in approver_set_refusal.
  absl::StatusOr<Update> Accept(const bettercompute::agent::v1::SignedTrustBundle& signed_bundle,
                                const PublicKey& join_service_key) const;

  const bettercompute::agent::v1::TrustBundle& bundle() const { return bundle_; }
  uint64_t version() const { return bundle_.version(); }
  const std::string& trust_domain() const { return bundle_.trust_domain(); }
  const ApproverSet& approvers() const { return approvers_; }
  const std::vector<Certificate>& command_signing_roots() const { return command_signing_roots_; }
  const std::vector<Certificate>& node_cas() const { return node_cas_; }
  // The signed bundle this state was taken from, and the one its approver set came from (the
  // same bundle unless a later bundle's approver-set change was refused): what is persisted.
  const bettercompute::agent::v1::SignedTrustBundle& signed_bundle() const { return signed_; }
  const bettercompute::agent::v1::SignedTrustBundle& approver_source() const {
    return approver_source_;
  }
  bool HoldsAnEarlierApproverSet() const { return approver_source_.body() != signed_.body(); }

 private:
  TrustState() = default;
  static absl::StatusOr<TrustState> Verify(
      const bettercompute::agent::v1::SignedTrustBundle& signed_bundle,
      const PublicKey& join_service_key);

  bettercompute::agent::v1::TrustBundle bundle_;
  bettercompute::agent::v1::SignedTrustBundle signed_;
  bettercompute::agent::v1::SignedTrustBundle approver_source_;
  ApproverSet approvers_;
  std::vector<Certificate> command_signing_roots_;
  std::vector<Certificate> node_cas_;
};

struct TrustState::Update {
  TrustState state;
  std::string approver_set_refusal;  // empty: the bundle's set was taken or was already held
};

}  // namespace bcd::pki
