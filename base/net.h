#pragma once

// Network addresses as the config and the transports read them: IP literals, CIDR blocks, ports.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"
#include "base/fd.h"

namespace bcd {

// An IP literal as its 4 or 16 bytes; nullopt when `text` is not one.
std::optional<std::string> IpBytes(std::string_view text);
// Whether `address` (an IP literal) lies in `block` ("10.0.0.0/8", "fd00::/8"; an IP alone is a
// block of one).
bool InCidr(std::string_view block, std::string_view address);

// A TCP port in decimal, 1..65535; nullopt otherwise.
std::optional<uint16_t> ParsePort(std::string_view text);

// Whether `text` is an IPv4 literal ("10.0.0.1"), or an IPv6 one without brackets.
bool IsIpv4(const std::string& text);
bool IsIpv6(const std::string& text);
// An RFC 1123 host name: dot-separated labels of letters, digits and inner hyphens, and not all
// digits at the end (that would read as a bad IPv4 address).
bool IsDnsName(std::string_view name);
// Splits "host:port" or "[v6]:port" into its parts (the port may be empty); nullopt when
// malformed.
std::optional<std::pair<std::string, std::string_view>> SplitHostPort(std::string_view text);

// A TCP socket listening on `host` (an IPv4 literal, or IPv6 without brackets) and `port` (0: a
// free one), close-on-exec, with SO_REUSEADDR; and the port it got. Errors start with `what` (the
// listener's name): InvalidArgument for a host that is not an IP literal, Unavailable when it
// cannot bind or listen.
struct Listening {
  Fd fd;
  uint16_t port = 0;
};
absl::StatusOr<Listening> ListenTcp(std::string_view what, const std::string& host, uint16_t port,
                                    int backlog);

}  // namespace bcd
