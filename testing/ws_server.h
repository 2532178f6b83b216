#pragma once

// The server half of the WebSocket transport, for the dev gateway and the tests: a TLS 1.3
// listener that hands each request to a handler, which answers it (POST /v1/renew) or accepts the
// upgrade. Not linked into bcd.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "transport/websocket.h"

namespace bcd::testing {

// One open WebSocket. Read from one thread and write from others at the same time.
class WsConnection {
 public:
  virtual ~WsConnection() = default;
  // The next message; false when the connection ended.
  virtual bool Read(std::string* message, bool* text) = 0;
  virtual bool WriteBinary(std::string_view message) = 0;
  virtual bool WriteText(std::string_view message) = 0;
  // Bytes straight onto the TLS stream, past the WebSocket framing (tests of bad framing).
  virtual bool WriteRaw(std::string_view bytes) = 0;
  // Starts the close handshake; returns at once.
  virtual void Close(uint16_t code, std::string_view reason) = 0;
  // Drops the connection (a blocked Read returns false).
  virtual void Abort() = 0;
  // Whether the peer ended the connection with a close frame, and its code (0 when none came).
  virtual bool closed_by_peer() const = 0;
  virtual int peer_close_code() const = 0;
};

struct HttpRequestInfo {
  std::string method;
  std::string target;
  std::string host;                            // the Host header without its port
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  bool upgrade = false;  // a WebSocket upgrade request
};

// A request the listener received; the handler answers it or accepts the upgrade.
class WsExchange {
 public:
  virtual ~WsExchange() = default;
  virtual const HttpRequestInfo& request() const = 0;
  virtual void Answer(const transport::HttpAnswer& answer) = 0;
  // Answers 101 with `headers` (and the subprotocol); nullptr when the handshake failed.
  virtual std::unique_ptr<WsConnection> Accept(
      const std::vector<std::pair<std::string, std::string>>& headers) = 0;
};

class WsListener {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    uint16_t port = 0;
    std::string key_pem;
    std::string chain_pem;  // serving leaf first
    std::size_t max_body = 64 * 1024;
    std::size_t max_message = 16 * 1024 * 1024;
  };
  // Each connection runs `handler` on its own thread.
  static absl::StatusOr<std::unique_ptr<WsListener>> Start(
      Options options, std::function<void(WsExchange&)> handler);
  virtual ~WsListener() = default;
  virtual uint16_t port() const = 0;
};

}  // namespace bcd::testing
