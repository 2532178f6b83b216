#pragma once

// The gateway as the config names it, as a transport channel spec (target, name to check, pin).

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "config/config.h"
#include "transport/tls.h"
#include "transport/websocket.h"

namespace bcd {

// Requires a config with gateway_url and gateway_ca_spki_sha256 (every parsed config has them).
transport::ChannelSpec GatewayChannel(const Config& config, UnixClock now);

// The [websocket] section as a transport spec: the URL, the name the serving leaf must carry (the
// URL's host, or gateway_server_name when the URL names an IP), the pin, and proxy_ca_file read
// now (an error names the file). Requires config.websocket().
absl::StatusOr<transport::WebSocketSpec> WebSocketChannel(const Config& config, UnixClock now);

}  // namespace bcd
