#pragma once

// agent/v1 over an RFC 6455 WebSocket (Boost.Beast), for networks whose TLS-inspecting proxy strips
// client certificates: wss://<host>/v1/session, through the environment's HTTP CONNECT proxy when
// one applies, one encoded frame per binary message (at most 16 MiB), pings answered and sent, the
// close handshake done, text messages refused. TLS 1.3 only, verified against the pinned serving CA
// or, for the transport only, against [websocket] proxy_ca_file; either way the 101 must carry a
// gateway proof (ws_auth.h) or the connection is closed before any frame is read.
//
// All Beast and Asio code lives in websocket.cc. The listener below is the server half, for the dev
// gateway and tests (a real gateway is not this program).

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "pki/keys.h"
#include "pki/x509.h"
#include "transport/proxy.h"
#include "transport/refusal.h"
#include "transport/transport.h"

namespace bcd::transport {

struct WebSocketSpec {
  std::string host;  // from the URL; IPv6 without brackets
  uint16_t port = 443;
  std::string path = "/v1/session";
  std::string server_name;     // the name the gateway's serving leaf must carry
  std::string ca_spki_sha256;  // 32 bytes: the pinned serving CA
  // When set, the TLS of the transport is verified against these CAs (a TLS-inspecting proxy's)
  // and the URL's host instead of the pin. The gateway proof is still checked against the pin.
  std::optional<std::string> proxy_ca_pem;
  EnvLookup env = ProcessEnv;  // https_proxy, no_proxy
  // A ping after keepalive_time without data; the connection is dead after keepalive_timeout
  // more.
  std::chrono::milliseconds keepalive_time = std::chrono::seconds(20);
  std::chrono::milliseconds keepalive_timeout = std::chrono::seconds(20);
  std::chrono::milliseconds dial_timeout = std::chrono::seconds(30);
  // Unix seconds: certificates and the gateway's proof are checked against it, and the node's
  // proof is dated with it. Required.
  UnixClock now;
};

// The node's identity for one dial (re-read each time, so a renewal applies to the next).
struct WsNodeIdentity {
  pki::PrivateKey key;
  std::vector<pki::Certificate> chain;  // leaf first
  std::string node_id;
};

class WebSocketTransport final : public Transport {
 public:
  WebSocketTransport(WebSocketSpec spec, std::function<absl::StatusOr<WsNodeIdentity>()> identity);
  // Returns at once; the dial runs on the stream's own thread, and a failed dial, a refused
  // upgrade or a gateway without a valid proof shows as the stream's end (Finish), with the
  // gateway's reason and pushback, like a refused gRPC call.
  absl::StatusOr<std::unique_ptr<FrameStream>> OpenSession() override;
  // Unimplemented: the gateway serves Join over gRPC only (a node joins before it moves to the
  // WebSocket).
  absl::StatusOr<bettercompute::agent::v1::JoinResponse> Join(
      const bettercompute::agent::v1::JoinRequest& request, Refusal* refusal) override;
  // POST /v1/renew on the WebSocket origin (no client certificate: the request's chain and proof
  // of possession identify the node), through the same proxy and TLS trust as the session.
  absl::StatusOr<bettercompute::agent::v1::RenewResponse> Renew(
      const bettercompute::agent::v1::RenewRequest& request, Refusal* refusal) override;

 private:
  WebSocketSpec spec_;
  std::function<absl::StatusOr<WsNodeIdentity>()> identity_;
};

// One HTTPS request to the WebSocket origin (POST /v1/renew), through the same proxy and TLS
// trust. The answer's body is read up to `max_answer` bytes. An error status means no HTTP answer
// came (its message says why); HTTP refusals come back as answers.
struct HttpAnswer {
  unsigned status = 200;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
};
absl::StatusOr<HttpAnswer> HttpsPost(const WebSocketSpec& spec, std::string_view target,
                                     std::string_view content_type, std::string_view body,
                                     std::size_t max_answer);

}  // namespace bcd::transport
