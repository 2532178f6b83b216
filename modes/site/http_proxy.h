#pragma once

// site.httpProxy: one HTTP request into the site network for the control plane. The URL's host is
// resolved once and each address decided against [site] http_proxy_allow (IP or CIDR and port;
// nothing is allowed by default); loopback and link-local addresses (this machine, a cloud's
// metadata address) only by a rule that names such a block itself, never by a wider one
// (0.0.0.0/0 does not reach 127.0.0.1); multicast and unspecified addresses never. Only the
// allowed addresses are connected to. Headers named in secret_headers get the values of their
// secret references (fetched for the command's workflow step); those values appear in no log line,
// and a secret value the server echoes back is replaced by "[redacted]" in the result. Redirects
// are returned, not followed; the body is cut at max_response_bytes (default 1 MiB, at most
// kMaxResponseBytes) with `truncated` set; the exchange ends with the command's time or
// kTimeout.

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "config/values.h"
#include "daemon/mode.h"

namespace bcd {

struct HttpProxyOptions {
  std::vector<TunnelAllowRule> allow;
  std::string ca_file;  // more roots for https
  // The addresses a name resolves to (tests); the system's resolver when unset.
  std::function<std::vector<std::string>(const std::string& host)> resolve;
};

constexpr std::size_t kMaxResponseBytes = 3 << 20;  // what fits a command result's frame
constexpr std::size_t kDefaultResponseBytes = 1 << 20;
constexpr std::chrono::seconds kHttpProxyTimeout{25};

// OK when a request to `address` (an IP literal) on `port` is allowed by `allow`; else
// PermissionDenied saying why.
absl::Status CheckProxyDestination(const std::vector<TunnelAllowRule>& allow,
                                   const std::string& address, uint16_t port);

absl::Status RegisterHttpProxy(const ModeContext& context, HttpProxyOptions options);

}  // namespace bcd
