#pragma once

// The gateway as the config names it, as a transport channel spec (target, name to check, pin).

#include "daemon/config.h"
#include "transport/tls.h"

namespace bcd {

// Requires a config with gateway_url and gateway_ca_spki_sha256 (every parsed config has them).
transport::ChannelSpec GatewayChannel(const Config& config);

}  // namespace bcd
