#pragma once

// TLS for the gRPC transport: TLS 1.3 only, and a server is trusted only when its chain leads to
// the CA whose SPKI sha256 is pinned (never the system roots) and its leaf carries the expected
// name.

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "base/clock.h"
#include "base/mutex.h"
#include "grpcpp/channel.h"
#include "grpcpp/security/server_credentials.h"
#include "pki/x509.h"

namespace bcd::transport {

// Makes every TLS context this process creates refuse anything below TLS 1.3. gRPC 1.51 has no
// option for it and overrides MinProtocol, so it goes through OpenSSL's system_default config
// (Protocol = -TLSv1.2 on top of gRPC's own 1.2 floor). Idempotent; call before gRPC touches TLS.
absl::Status RequireTls13();

// Makes gRPC's own log lines structured like bcd's (level=... event=grpc ...) on stderr, errors
// only.
void StructureGrpcLogs();

// The reason of the last server verification failure, for a message a person can act on (gRPC
// reports a failed handshake only as UNAVAILABLE). Thread-safe.
class VerificationLog {
 public:
  void Record(std::string reason);
  std::string Last() const;

 private:
  mutable Mutex mu_;
  std::string last_ ABSL_GUARDED_BY(mu_);
};

// OK when `chain` (leaf first, as the gateway sent it) holds the CA whose SPKI sha256 is `pin`,
// the leaf chains to it at `now`, and the leaf carries `server_name` (a DNS name or an IP).
// Unauthenticated errors name what failed. Used for the TLS handshake and the gateway proof.
absl::Status CheckPinnedChain(const std::vector<pki::Certificate>& chain, std::string_view pin,
                              const std::string& server_name, int64_t now);

struct ClientIdentity {
  std::string key_pem;
  std::string chain_pem;  // leaf first
};

struct ChannelSpec {
  std::string target;       // host:port
  std::string server_name;  // the name (DNS or IP) the gateway leaf must carry
  std::array<uint8_t, 32> ca_spki_sha256{};
  std::optional<ClientIdentity> identity;  // absent for Join (server-authenticated TLS)
  std::shared_ptr<VerificationLog> log;    // optional
  // Unix seconds: the gateway's certificates are checked against it. Required (a spec without a
  // clock verifies nothing).
  UnixClock now;
  // HTTP/2 PING every keepalive_time; no answer within keepalive_timeout ends the connection.
  std::chrono::milliseconds keepalive_time = std::chrono::seconds(20);
  std::chrono::milliseconds keepalive_timeout = std::chrono::seconds(20);
};

// A channel with HTTP/2 keepalive pings (by default every 20 s: a dead peer is noticed within 40
// s).
std::shared_ptr<grpc::Channel> MakeChannel(const ChannelSpec& spec);

struct ServerTlsSpec {
  std::string key_pem;
  std::string chain_pem;             // serving leaf then its CA
  std::string client_ca_pem;         // node CA(s); a client certificate is verified against them
  bool require_client_cert = false;  // false lets Join in without one; RPCs check the identity
};

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const ServerTlsSpec& spec);

// Server keepalive settings that allow the daemon's 20 s pings.
void ConfigureServerKeepalive(class grpc::ServerBuilder* builder);

}  // namespace bcd::transport
