#include "daemon/identity/gateway.h"

#include <algorithm>

#include "base/files.h"
#include "fmt/format.h"
#include "pki/x509.h"
#include "proto/absl_compat.h"

namespace bcd {

transport::ChannelSpec GatewayChannel(const Config& config, UnixClock now) {
  const Url& url = *config.gateway_url();
  transport::ChannelSpec spec;
  spec.now = std::move(now);
  bool ipv6 = url.host().find(':') != std::string::npos;
  spec.target = ipv6 ? fmt::format("[{}]:{}", url.host(), url.port())
                     : fmt::format("{}:{}", url.host(), url.port());
  spec.server_name = config.GatewayServerName();
  const auto& pin = config.gateway_ca_spki_sha256()->bytes();
  std::copy(pin.begin(), pin.end(), spec.ca_spki_sha256.begin());
  return spec;
}

absl::StatusOr<transport::WebSocketSpec> WebSocketChannel(const Config& config, UnixClock now) {
  const WebSocketConfig& ws = *config.websocket();
  transport::WebSocketSpec spec;
  spec.now = std::move(now);
  spec.host = ws.url.host();
  spec.port = ws.url.port();
  spec.path = ws.url.path().empty() ? "/" : ws.url.path();
  spec.server_name = ws.url.host_is_ip() ? config.GatewayServerName() : ws.url.host();
  const auto& pin = config.gateway_ca_spki_sha256()->bytes();
  spec.ca_spki_sha256.assign(pin.begin(), pin.end());
  if (ws.proxy_ca_file) {
    absl::StatusOr<std::string> pem = ReadWholeFile(*ws.proxy_ca_file, 1024 * 1024);
    if (!pem.ok()) {
      return absl::InvalidArgumentError(fmt::format("[websocket] proxy_ca_file {}: {}",
                                                    ws.proxy_ca_file->string(),
                                                    ToStd(pem.status().message())));
    }
    if (absl::StatusOr<std::vector<pki::Certificate>> cas = pki::ParsePemChain(*pem); !cas.ok()) {
      return absl::InvalidArgumentError(fmt::format("[websocket] proxy_ca_file {}: {}",
                                                    ws.proxy_ca_file->string(),
                                                    ToStd(cas.status().message())));
    }
    spec.proxy_ca_pem = *pem;
  }
  return spec;
}

}  // namespace bcd
