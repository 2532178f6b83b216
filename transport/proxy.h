#pragma once

// The HTTP CONNECT proxy the WebSocket transport goes through, from the environment as curl and
// most agents read it: https_proxy (or HTTPS_PROXY), with no_proxy (or NO_PROXY) naming the hosts
// reached directly. Pure: the environment comes in as a lookup function.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "base/net.h"

namespace bcd::transport {

struct ProxySpec {
  std::string host;  // IPv6 without brackets
  uint16_t port = 0;
  // "Basic <base64>" from the URL's user info (percent-decoded), or empty.
  std::string authorization;
  // The proxy URL with any password replaced by "***", for messages.
  std::string display;
};

// Parses a proxy URL: [http://][user[:password]@]host[:port][/]. The port defaults to 80 (1080 is
// not guessed); only http proxies are spoken to (https:// and socks schemes are refused by name).
absl::StatusOr<ProxySpec> ParseProxyUrl(std::string_view text);

// True when `host` (a name or an IP literal, no port) is excluded by a no_proxy list:
// comma-separated entries, "*" for every host, a name matching itself and its subdomains (a
// leading "." is allowed), an IP literal matching exactly, an IPv4 or IPv6 CIDR block, and an
// optional ":port" on an entry matching only that port.
bool NoProxyMatches(std::string_view no_proxy, std::string_view host, uint16_t port);

// The proxy for https/wss traffic to host:port, or nullopt for a direct connection. An error when
// the proxy variable is set but cannot be used (it names the variable).
using EnvLookup = std::function<std::optional<std::string>(const char*)>;
absl::StatusOr<std::optional<ProxySpec>> ProxyFor(std::string_view host, uint16_t port,
                                                  const EnvLookup& env);
// The process environment, for ProxyFor.
std::optional<std::string> ProcessEnv(const char* name);

}  // namespace bcd::transport
