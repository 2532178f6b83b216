#pragma once

// Network addresses as the config and the transports read them: IP literals, CIDR blocks, ports.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace bcd {

// An IP literal as its 4 or 16 bytes; nullopt when `text` is not one.
std::optional<std::string> IpBytes(std::string_view text);
// Whether `address` (an IP literal) lies in `block` ("10.0.0.0/8", "fd00::/8"; an IP alone is a
// block of one).
bool InCidr(std::string_view block, std::string_view address);

// A TCP port in decimal, 1..65535; nullopt otherwise.
std::optional<uint16_t> ParsePort(std::string_view text);

}  // namespace bcd
