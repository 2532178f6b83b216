#include "proto/version.h"

#include <charconv>
#include <limits>
#include <optional>

#include "fmt/format.h"

namespace bcd::proto {
namespace {

absl::Status InvalidConfig(std::string message) {
  return absl::InvalidArgumentError("INVALID_CONFIG: " + message);
}

// A decimal integer and nothing else; nullopt for "", "1.5", "+1", "0x2", " 1".
std::optional<int64_t> ParseInteger(std::string_view text) {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace

absl::StatusOr<ProtocolRange> ProtocolRange::Make(int64_t min, int64_t max) {
  if (min < 1) return InvalidConfig(fmt::format("protocol range minimum {} is below 1", min));
  if (max < min) {
    return InvalidConfig(
        fmt::format("protocol range maximum {} is below its minimum {}", max, min));
  }
  if (max > std::numeric_limits<uint32_t>::max()) {
    return InvalidConfig(fmt::format("protocol range maximum {} is out of range", max));
  }
  return ProtocolRange(static_cast<uint32_t>(min), static_cast<uint32_t>(max));
}

absl::StatusOr<ProtocolRange> ProtocolRange::Parse(std::string_view text) {
  std::size_t dots = text.find("..");
  std::string_view min_text = dots == std::string_view::npos ? text : text.substr(0, dots);
  std::string_view max_text = dots == std::string_view::npos ? text : text.substr(dots + 2);
  std::optional<int64_t> min = ParseInteger(min_text);
  std::optional<int64_t> max = ParseInteger(max_text);
  if (!min || !max) {
    return InvalidConfig(
        fmt::format("protocol range \"{}\" is not MIN..MAX with integer bounds", text));
  }
  return Make(*min, *max);
}

std::string ProtocolRange::ToString() const { return fmt::format("{}..{}", min_, max_); }

absl::StatusOr<Negotiated> Negotiate(const ProtocolRange& gateway, const ProtocolRange& daemon) {
  if (daemon.max() < gateway.min()) return Negotiated{gateway.min(), true};
  if (daemon.min() > gateway.max()) {
    return absl::FailedPreconditionError(
        fmt::format("daemon protocol range {} is above the gateway's {}", daemon.ToString(),
                    gateway.ToString()));
  }
  return Negotiated{std::min(gateway.max(), daemon.max()), false};
}

absl::Status CheckWelcomeVersion(const ProtocolRange& daemon, uint32_t protocol_version,
                                 bool upgrade_required) {
  if (upgrade_required) {
    if (protocol_version <= daemon.max()) {
      return absl::InvalidArgumentError(fmt::format(
          "Welcome says upgrade required at version {}, which this daemon ({}) already speaks",
          protocol_version, daemon.ToString()));
    }
    return absl::OkStatus();
  }
  if (!daemon.Contains(protocol_version)) {
    return absl::InvalidArgumentError(
        fmt::format("Welcome chose protocol version {}, outside this daemon's range {}",
                    protocol_version, daemon.ToString()));
  }
  return absl::OkStatus();
}

}  // namespace bcd::proto
