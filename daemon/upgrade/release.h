#pragma once

// A release, verified before anything changes (wire.md "Releases"): the key that signed it is
// pinned in [update] release_keys, the signature covers this node's os/arch, the version is semver
// and neither lower than the highest version that ever ran here nor the one running now, and the
// URL is https. Pure: the caller hands in the pins, the floor and the node's facts.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "bettercompute/agent/v1/commands.pb.h"
#include "config/values.h"

namespace bcd::upgrade {

// MAJOR.MINOR.PATCH[-PRERELEASE] (semver 2.0.0; build metadata "+..." is refused: two binaries of
// one version must not differ).
struct Semver {
  uint64_t major = 0, minor = 0, patch = 0;
  std::vector<std::string> pre;  // the dot-separated pre-release identifiers; empty for a release
  static std::optional<Semver> Parse(std::string_view text);
  std::string ToString() const;
};
// Semver precedence: negative, zero or positive as a is lower than, equal to or higher than b.
int Compare(const Semver& a, const Semver& b);

// The os/arch a release is signed for, from uname's machine: "linux/amd64" for x86_64,
// "linux/arm64" for aarch64; "" for any other.
std::string OsArch(std::string_view machine);

struct ReleasePolicy {
  std::vector<ReleaseKey> pins;   // [update] release_keys
  std::string os_arch;            // this node's
  std::string running;            // the version running now
  std::optional<Semver> highest;  // the highest version that ever ran here (state dir)
  // Reads a PEM pin's file.
  std::function<absl::StatusOr<std::string>(const std::filesystem::path&)> read_file;
};

// OK when `payload` may be installed. Otherwise, naming what is wrong:
//   Unimplemented      no release keys are pinned (the binary must be replaced by hand)
//   PermissionDenied   the key is not pinned, or the signature does not verify for this os/arch
//   InvalidArgument    a malformed field (version, sha256, URL, key)
//   FailedPrecondition the version is lower than the highest that ran here, or is the one running
absl::Status VerifyRelease(const bettercompute::agent::v1::DaemonUpgradePayload& payload,
                           const ReleasePolicy& policy);

}  // namespace bcd::upgrade
