#pragma once

// Approvals of destructive commands (kinds with the quorum flag), per the approver set.
//
// The status code tells the dispatcher which rejection to report:
//   PermissionDenied  -> QUORUM        (too few, duplicate signer, unknown key, manifest mismatch)
//   Unauthenticated   -> BAD_SIGNATURE (an approval by a known key that does not verify)
//   InvalidArgument   -> INVALID_PAYLOAD (the manifest does not decode)
//   ResourceExhausted -> RATE_LIMITED  (HourlyLimit)

#include <cstdint>
#include <deque>
#include <string_view>

#include "absl/status/status.h"
#include "bettercompute/agent/v1/commands.pb.h"
#include "pki/trust.h"

namespace bcd::pki {

// An empty set approves everything. Otherwise an unbatched command needs approver_threshold
// distinct approvals over sha256(body); a batched one needs the tier's threshold over
// sha256(manifest), and the manifest must name this node and command.
absl::Status CheckApprovals(
    std::string_view command_body, const bettercompute::agent::v1::Command& command,
    const google::protobuf::RepeatedPtrField<bettercompute::common::v1::Signature>& approvals,
    std::string_view batch_manifest, std::string_view node_id, const ApproverSet& set);

// Unbatched destructive commands allowed per node per hour, over a sliding hour. Not thread-safe.
class HourlyLimit {
 public:
  // Counts one command at `now` (unix seconds) unless `per_hour` are already counted in the hour
  // before it; 0 means no limit.
  absl::Status Take(int64_t now, uint32_t per_hour);
  // Counts one taken at `at` without checking (restoring a persisted count).
  void Restore(int64_t at) { taken_.push_back(at); }
  const std::deque<int64_t>& taken() const { return taken_; }

 private:
  std::deque<int64_t> taken_;
};

}  // namespace bcd::pki
