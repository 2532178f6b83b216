#include "pki/approvals.h"

#include <set>

#include "fmt/format.h"
#include "proto/absl_compat.h"
#include "proto/frame_codec.h"
#include "proto/signing_input.h"

namespace bcd::pki {

absl::Status CheckApprovals(
    std::string_view command_body, const bettercompute::agent::v1::Command& command,
    const google::protobuf::RepeatedPtrField<bettercompute::common::v1::Signature>& approvals,
    std::string_view batch_manifest, std::string_view node_id, const ApproverSet& set) {
  if (set.empty()) return absl::OkStatus();
  std::string digest;
  uint32_t threshold = set.threshold();
  bool batched = !command.batch_id().empty() || !batch_manifest.empty();
  if (batched) {
    bettercompute::agent::v1::BatchManifest manifest;
    if (absl::Status s = proto::DecodeMessage(batch_manifest, &manifest); !s.ok()) {
      return absl::InvalidArgumentError(fmt::format("batch manifest: {}", ToStd(s.message())));
    }
    if (manifest.batch_id() != command.batch_id() || manifest.kind() != command.kind()) {
      return absl::PermissionDeniedError(fmt::format(
          "batch manifest is for batch \"{}\" of {}, the command is in batch \"{}\" of {}",
          manifest.batch_id(), manifest.kind(), command.batch_id(), command.kind()));
    }
    bool named = false;
    for (const auto& target : manifest.targets()) {
      named = named || (target.node_id() == node_id && target.command_id() == command.command_id());
    }
    if (!named) {
      return absl::PermissionDeniedError(
          fmt::format("batch manifest does not name node \"{}\" with command \"{}\"", node_id,
                      command.command_id()));
    }
    digest = Sha256(batch_manifest);
    threshold = set.ThresholdForBatch(static_cast<std::size_t>(manifest.targets_size()));
  } else {
    digest = Sha256(command_body);
  }
  std::string input = proto::ApproveSigningInput(digest);
  std::set<std::string> signers;
  for (const auto& approval : approvals) {
    const Approver* approver = set.Find(approval.kid());
    if (approver == nullptr) {
      return absl::PermissionDeniedError(
          fmt::format("approval by unknown key \"{}\"", approval.kid()));
    }
    if (!signers.insert(approver->kid).second) {
      return absl::PermissionDeniedError(
          fmt::format("two approvals by the same key \"{}\"", approver->kid));
    }
    if (absl::Status s = approver->key.VerifyEs256(input, approval.sig()); !s.ok()) {
      return absl::UnauthenticatedError(
          fmt::format("approval by \"{}\" does not verify: {}", approver->kid, ToStd(s.message())));
    }
  }
  if (signers.size() < threshold) {
    return absl::PermissionDeniedError(fmt::format("{} of {} approvals needed{}", signers.size(),
                                                   threshold,
                                                   batched ? " for a batch of this size" : ""));
  }
  return absl::OkStatus();
}

absl::Status HourlyLimit::Take(int64_t now, uint32_t per_hour) {
  while (!taken_.empty() && taken_.front() <= now - 3600) taken_.pop_front();
  if (per_hour != 0 && taken_.size() >= per_hour) {
    return absl::ResourceExhaustedError(
        fmt::format("{} unbatched destructive commands in the last hour, the limit is {}",
                    taken_.size(), per_hour));
  }
  taken_.push_back(now);
  return absl::OkStatus();
}

}  // namespace bcd::pki
