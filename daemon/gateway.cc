#include "daemon/gateway.h"

#include <algorithm>

#include "fmt/format.h"

namespace bcd {

transport::ChannelSpec GatewayChannel(const Config& config) {
  const Url& url = *config.gateway_url();
  transport::ChannelSpec spec;
  bool ipv6 = url.host().find(':') != std::string::npos;
  spec.target = ipv6 ? fmt::format("[{}]:{}", url.host(), url.port())
                     : fmt::format("{}:{}", url.host(), url.port());
  spec.server_name = config.GatewayServerName();
  const auto& pin = config.gateway_ca_spki_sha256()->bytes();
  std::copy(pin.begin(), pin.end(), spec.ca_spki_sha256.begin());
  return spec;
}

}  // namespace bcd
