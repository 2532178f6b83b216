#pragma once

// The dev gateway: a real AgentGateway on loopback, over TLS 1.3 with the dev PKI, for bcd's tests
// and for anyone trying bcd. Today it serves Join (single-use expiring tokens, deferral on demand);
// Renew, Session and Tunnel answer UNIMPLEMENTED until their work lands.
//
// Thread-safe: tests call it from their own thread while gRPC threads serve.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "testing/dev_pki.h"

namespace grpc {
class Server;
}

namespace bcd::testing {

struct DevGatewayOptions {
  std::string listen = "127.0.0.1:0";
  int64_t node_cert_lifetime = 86400;  // seconds
  std::function<int64_t()> now;        // unix seconds; defaults to the system clock
};

class DevGateway {
 public:
  static absl::StatusOr<std::unique_ptr<DevGateway>> Start(const DevPki& pki,
                                                           DevGatewayOptions options);
  ~DevGateway();

  int port() const { return port_; }
  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }

  // A single-use join token for `node_id`, valid `ttl` seconds.
  std::string AddJoinToken(const std::string& node_id, int64_t ttl = 3600);
  // The next `count` joins are deferred by `retry_after` seconds.
  void DeferJoins(int count, uint32_t retry_after);
  // Joins granted so far.
  int joins_granted() const;
  // How many Join calls arrived, granted or not.
  int join_calls() const;

  struct State;

 private:
  DevGateway() = default;
  std::shared_ptr<State> state_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<class AgentGatewayService> service_;
  int port_ = 0;
};

}  // namespace bcd::testing
