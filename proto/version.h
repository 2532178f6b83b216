#pragma once

// Protocol version ranges and negotiation (the protocol page, "Version skew").
//
// The gateway picks the highest version inside both ranges. When the ranges do not overlap because
// the daemon is below the gateway's minimum, the Welcome says upgrade_required and carries the
// gateway's minimum. A range with min below 1 or max below min is INVALID_CONFIG.

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace bcd::proto {

class ProtocolRange {
 public:
  // INVALID_CONFIG (InvalidArgument) for min < 1, max < min or a bound above 2^32-1.
  static absl::StatusOr<ProtocolRange> Make(int64_t min, int64_t max);
  // "MIN..MAX" or a single "N"; bounds are decimal integers. Anything else is INVALID_CONFIG.
  static absl::StatusOr<ProtocolRange> Parse(std::string_view text);

  uint32_t min() const { return min_; }
  uint32_t max() const { return max_; }
  bool Contains(uint32_t version) const { return version >= min_ && version <= max_; }
  std::string ToString() const;  // "1..1"

  friend bool operator==(const ProtocolRange&, const ProtocolRange&) = default;

 private:
  friend struct ProtocolVersionConstant;
  constexpr ProtocolRange(uint32_t min, uint32_t max) : min_(min), max_(max) {}
  uint32_t min_;
  uint32_t max_;
};

// The versions this build speaks: PROTOCOL_VERSION = {1, 1}.
struct ProtocolVersionConstant {
  static constexpr ProtocolRange Get() { return ProtocolRange(1, 1); }
};
inline constexpr ProtocolRange kProtocolVersion = ProtocolVersionConstant::Get();

// What a gateway answers in Welcome.
struct Negotiated {
  uint32_t protocol_version;  // the highest shared version, or the gateway's minimum
  bool upgrade_required;      // the daemon is below the gateway's minimum

  friend bool operator==(const Negotiated&, const Negotiated&) = default;
};

// Gateway side. FailedPrecondition when the daemon's minimum is above the gateway's maximum: the
// daemon is newer than anything this gateway speaks, and no Welcome can serve it.
absl::StatusOr<Negotiated> Negotiate(const ProtocolRange& gateway, const ProtocolRange& daemon);

// Daemon side: accepts a Welcome's (protocol_version, upgrade_required) or says why not. Without
// upgrade_required the version must lie inside the daemon's range; with it, it must lie above it.
absl::Status CheckWelcomeVersion(const ProtocolRange& daemon, uint32_t protocol_version,
                                 bool upgrade_required);

}  // namespace bcd::proto
