#pragma once

// The command-kind table: every kind bcd knows, with the modes that run it, its lane, its default
// timeout and its flags. It is the one place these facts live; the dispatcher, the capability list
// and the tests read it from here.

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "bettercompute/agent/v1/commands.pb.h"

namespace bcd::proto {

enum class Mode : uint8_t { kNode = 1, kSite = 2, kRamdisk = 4 };

std::string_view ModeName(Mode mode);  // "node", "site", "ramdisk"
std::optional<Mode> ParseMode(std::string_view name);

// Lanes bound concurrency: a command waits for its lane, and its timeout starts when it runs.
enum class Lane : uint8_t {
  kControl,    // quick, read-mostly work
  kBulk,       // uploads and other long transfers
  kPower,      // reboot and kexec: one at a time
  kExclusive,  // runs alone (self-upgrade)
  kDriver,     // hosted plugins
  kPerBmc,     // one operation at a time per BMC address
  kDiag,       // GPU diagnostics
  kDisk,       // wipes and image writes
};

std::string_view LaneName(Lane lane);

enum KindFlag : uint32_t {
  // Refused UNSIGNED without a valid worker signature when command signing is on (always on a
  // signed-only session).
  kSigned = 1u << 0,
  // Destructive: needs approvals from the approver set.
  kQuorum = 1u << 1,
  // The only kind allowed while the gateway says upgrade_required.
  kUpgradeOk = 1u << 2,
  // Safe to run again after a restart interrupted it, instead of reporting it interrupted.
  kIdempotent = 1u << 3,
  // The timeout comes from the payload, not the table.
  kTimeoutFromPayload = 1u << 4,
};

struct KindSpec {
  std::string_view name;
  uint8_t modes;  // bitwise OR of Mode values
  Lane lane;
  std::chrono::seconds timeout;  // zero when kTimeoutFromPayload
  uint32_t flags;
  std::string_view payload_type;  // full protobuf name of the payload message
  std::string_view result_type;   // full protobuf name of the result message

  bool Has(KindFlag flag) const { return (flags & flag) != 0; }
  bool RunsIn(Mode mode) const { return (modes & static_cast<uint8_t>(mode)) != 0; }
};

// Every kind, in the order of the product's table.
std::span<const KindSpec> AllKinds();

// The kind named `name`, or nullptr when there is none.
const KindSpec* FindKind(std::string_view name);

// SUCCEEDED, FAILED, REJECTED, TIMED_OUT, CANCELLED: a command's last update.
bool IsTerminal(bettercompute::agent::v1::CommandState state);

// The kinds a mode runs, in table order.
std::vector<const KindSpec*> KindsForMode(Mode mode);

}  // namespace bcd::proto
