#pragma once

// `bcd join`: a fresh key and CSR, Join over server-authenticated TLS to the pinned gateway,
// deferrals answered with the same CSR after their delay, the answer verified (JoinService
// signature and pin, trust bundle, chain to the node CA, SPIFFE id, our key), then the identity
// stored in the state dir.

#include <chrono>
#include <functional>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "bettercompute/common/v1/common.pb.h"
#include "config/config.h"
#include "daemon/identity/identity.h"

namespace bcd {

struct JoinSpec {
  std::string attestor = "join-token";  // join-token, provisioned, ...
  std::string evidence;                 // the token or provisioning credential
  bettercompute::common::v1::Role role = bettercompute::common::v1::ROLE_NODE;
  std::string node_id;  // provisioned only
  bettercompute::common::v1::HardwareClaims claims;
  UnixClock now;
  std::function<void(std::chrono::seconds)> sleep;
  std::ostream* progress = nullptr;  // one line per step, for a person
};

inline constexpr int kMaxDeferrals = 100;

// PermissionDenied when the gateway refused (the message names its reason); Unavailable when it
// could not be reached or failed TLS verification (the message says why); FailedPrecondition when
// this node has already joined; another error when the answer does not verify.
absl::StatusOr<Identity> JoinFleet(const Config& config, const JoinSpec& spec);

}  // namespace bcd
