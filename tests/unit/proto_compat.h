#pragma once

// A breaking-change check in the spirit of `buf breaking` (FILE rules) for the frozen packages:
// compares a baseline FileDescriptorSet with the current one and lists every change that would
// break a peer built from the baseline. Additions are always allowed.

#include <string>
#include <vector>

#include "google/protobuf/descriptor.pb.h"

namespace bcd::testing {

// Each problem is one readable line naming the element, e.g.
//   "bettercompute.agent.v1.Hello: field 18 (approver_set_epoch) was removed".
// Only files whose package starts with one of `frozen_package_prefixes` are compared.
std::vector<std::string> BreakingChanges(const google::protobuf::FileDescriptorSet& baseline,
                                         const google::protobuf::FileDescriptorSet& current,
                                         const std::vector<std::string>& frozen_package_prefixes);

}  // namespace bcd::testing
