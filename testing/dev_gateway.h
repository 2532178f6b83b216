#pragma once

// The dev gateway: a real AgentGateway on loopback, over TLS 1.3 with the dev PKI, for bcd's tests
// and for anyone trying bcd. Join takes single-use expiring tokens and provisioning credentials
// (deferral on demand). Renew checks that the chain is the caller's TLS identity, the proof of
// possession, the timestamp (within 60 s) and the nonce (never seen before). Session reads the node
// id from the client certificate only, answers Hello with Welcome, acks command updates and events
// (or withholds acks), and lets tests push frames, refuse sessions and drop them. Secret and
// workload-token requests go to a dev broker (below). Tunnels: the gateway signs a ticket with its
// dev access key (TunnelJwks), sends OpenTunnel and hands the test the operator's side of the
// node's Tunnel stream (DevTunnel). The same sessions and renewals are served over WebSocket.
//
// Thread-safe: tests call it from their own thread while gRPC threads serve.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "bettercompute/agent/v1/session.pb.h"
#include "bettercompute/agent/v1/spec.pb.h"
#include "testing/dev_pki.h"

namespace grpc {
class Server;
}

namespace bcd::testing {

class WsListener;

struct DevGatewayOptions {
  std::string listen = "127.0.0.1:0";
  std::string protocol = "1..1";       // the gateway's protocol range
  int64_t node_cert_lifetime = 86400;  // seconds
  UnixClock now;                       // unix seconds; defaults to the system clock
  // Called with every frame a node sends after its Hello, on the session's thread, before the
  // frame is acknowledged: a control plane records updates and events here before it acks them.
  std::function<void(const std::string& node_id, const bettercompute::agent::v1::AgentFrame&)>
      on_frame;
  // Also serves sessions and POST /v1/renew over WebSocket here ("" for none), with the same
  // serving certificate.
  std::string websocket_listen = "127.0.0.1:0";
  // Joins hand out a trust bundle with the command-signing root (false: without).
  bool command_signing = true;
};

// The config.toml lines that point a bcd at a dev gateway on 127.0.0.1:`port`: gateway_url,
// gateway_server_name, the serving CA pin of `pki`, and `state_dir`. Callers append the rest.
std::string DevConfigToml(int port, const DevPki& pki, const std::filesystem::path& state_dir);

// The operator's side of one tunnel the dev gateway asked a node to open. Frames from the node
// wait in a queue of 4 (the gateway does not buffer more), so an operator that stops reading makes
// flow control reach the node.
class DevTunnel {
 public:
  struct Impl;
  explicit DevTunnel(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  const std::string& id() const;
  const std::string& ticket() const;
  // Whether the node opened the Tunnel stream (its first frame, `opened`, named this tunnel).
  bool WaitOpened(std::chrono::milliseconds timeout) const;
  bool Send(uint32_t channel, const std::string& bytes);
  bool Resize(uint32_t rows, uint32_t cols);
  // The next frame from the node; nullopt on timeout or when the stream ended.
  std::optional<bettercompute::agent::v1::TunnelFrame> Next(std::chrono::milliseconds timeout);
  // Reads until `closed` (or the timeout): stdout/stream and stderr bytes, and how it closed.
  struct Outcome {
    std::string out, err;
    bool closed = false;
    int exit_code = -1;
    std::string reason;
  };
  Outcome Collect(std::chrono::milliseconds timeout);
  // Reads until `out` holds `text` (or the timeout); what was read.
  std::string ReadUntil(const std::string& text, std::chrono::milliseconds timeout);
  // The operator closes: a `closed` frame to the node. Cancel drops the stream instead.
  bool Close();
  void Cancel();
  // Whether the stream ended (the node finished it or it was cancelled).
  bool WaitEnded(std::chrono::milliseconds timeout) const;

 private:
  std::shared_ptr<Impl> impl_;
};

// What a dev tunnel asks for, and how its ticket may go wrong for the tests of bcd's checks.
struct DevTunnelRequest {
  std::string op = "exec";  // shell, exec, tcp, instance-tcp
  std::vector<std::string> cmd;
  std::string host;
  uint16_t port = 0;
  std::string instance;
  uint16_t rows = 0, cols = 0;
  std::string aud;  // "" = node:<id>
  std::string sid;  // "" = the node's session
  std::string jti;  // "" = a fresh one
  std::string kid = "dev-access";
  int64_t clock_offset = 0;  // seconds added to iat and exp
  bool foreign_key = false;  // signed by a key outside the JWKS (with the right kid)
  std::string ticket;        // used as is when set (alg none, HS256, a replay ...)
};

class DevGateway {
 public:
  static absl::StatusOr<std::unique_ptr<DevGateway>> Start(const DevPki& pki,
                                                           DevGatewayOptions options);
  ~DevGateway();

  int port() const { return port_; }
  // DevConfigToml for this gateway.
  std::string ConfigToml(const std::filesystem::path& state_dir) const;
  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }
  // The WebSocket listener's port (0 when it does not run), and the [websocket] section for it.
  int websocket_port() const;
  std::string WebSocketConfigToml() const;

  // WebSocket sessions: the node is authenticated from the upgrade headers, the 101 carries the
  // gateway proof, and commands or specs without a signature stay pending (Push returns true and
  // keeps them; a gRPC session of the node takes them). These make the next `count` WebSocket
  // sessions go wrong in one way, for the tests of bcd's checks.
  enum class WsFault {
    kNone,
    kNoProof,           // the 101 carries no x-bc-gateway-proof
    kProofOtherNode,    // the proof names another node
    kProofOtherNonce,   // ... echoes another nonce
    kProofOldIat,       // ... was made 120 s ago
    kProofForeignKey,   // ... is signed by a serving leaf of a CA the node does not pin
    kTextMessage,       // after Welcome, a text message
    kOversizedMessage,  // after Welcome, a frame announcing 16 MiB + 1
    kBadMask,           // after Welcome, a masked frame
    kSilent,            // accepts, then never reads: pings go unanswered
  };
  void SetWsFault(WsFault fault, int count = 1);
  // WebSocket messages nodes sent on sessions whose 101 carried a bad (or no) gateway proof.
  int FramesAfterBadProof() const;
  // Unsigned commands and specs held for `node_id`.
  std::size_t PendingUnsigned(const std::string& node_id) const;
  // Sends a frame as is, past the signed-only hold (what a proxy in the middle could inject).
  bool PushUnfiltered(const std::string& node_id,
                      const bettercompute::agent::v1::ServerFrame& frame);
  // Sends a ServerFrame whose bytes do not decode (a string field that is not UTF-8).
  bool PushUndecodable(const std::string& node_id);
  // The next `count` sessions get no Welcome: Hello is read and left unanswered.
  void WithholdWelcomes(int count);
  // "grpc" or "websocket": how the last session of `node_id` came.
  std::string LastTransport(const std::string& node_id) const;
  // The close code the node sent when its last WebSocket session ended (0: none), once it has.
  std::optional<int> WaitForWsClose(const std::string& node_id,
                                    std::chrono::milliseconds timeout) const;
  void ForgetWsClose(const std::string& node_id);

  // A single-use join token for `node_id`, valid `ttl` seconds: `token` when given, else a fresh
  // random one.
  std::string AddJoinToken(const std::string& node_id, int64_t ttl = 3600, std::string token = "");
  // A provisioning credential for `node_id`, as a deploy would write it for the provisioned
  // attestor.
  std::string AddProvisioningCredential(const std::string& node_id);
  // The next `count` joins are deferred by `retry_after` seconds.
  void DeferJoins(int count, uint32_t retry_after);
  // Joins granted so far.
  int joins_granted() const;
  // How many Join calls arrived, granted or not.
  int join_calls() const;

  // Waits (up to `timeout`) until `count` Hellos have been welcomed in total; false on timeout.
  bool WaitForWelcomes(int count, std::chrono::milliseconds timeout) const;
  // Waits until `node_id` has no open session; false on timeout.
  bool WaitForNoSession(const std::string& node_id, std::chrono::milliseconds timeout) const;
  // The last Hello of `node_id`, and the node ids of every session opened, in order.
  std::optional<bettercompute::agent::v1::Hello> LastHello(const std::string& node_id) const;
  std::vector<std::string> SessionNodes() const;
  // Frames received from `node_id` after its Hello.
  std::vector<bettercompute::agent::v1::AgentFrame> Received(const std::string& node_id) const;
  // Waits until `node_id` sent at least `count` frames after its Hello.
  bool WaitForReceived(const std::string& node_id, std::size_t count,
                       std::chrono::milliseconds timeout) const;
  // Sends a frame on the open session of `node_id`; false when it has none.
  bool Push(const std::string& node_id, const bettercompute::agent::v1::ServerFrame& frame);
  // The next `count` sessions are refused with this status, x-bc-reason and pushback (0: none).
  void RefuseSessions(int count, int code, const std::string& reason, int64_t pushback_ms);
  // Ends every open session with UNAVAILABLE.
  void DropSessions();
  // Whether each of the last sessions ended cleanly (the daemon half-closed).
  int clean_ends() const;
  // Command updates and events are acknowledged as they arrive, unless withheld; resuming sends
  // one Ack covering what arrived meanwhile.
  void WithholdAcks(bool withhold);
  // Tunnels. The JWKS of the dev access key: put it in a spec's access section so the node checks
  // tickets against it.
  std::string TunnelJwks() const;
  // An access section with those keys that allows `ops` (every op by default).
  bettercompute::agent::v1::AccessSection TunnelAccess(std::vector<std::string> ops = {
                                                           "shell", "exec", "tcp",
                                                           "instance-tcp"}) const;
  // Signs a ticket for `request` and sends OpenTunnel to the node's session; the handle waits for
  // the node's Tunnel stream.
  DevTunnel OpenTunnel(const std::string& node_id, const DevTunnelRequest& request);

  // From now on `node_id`'s sessions and renewals are refused with `revoked`.
  void Revoke(const std::string& node_id);
  // Renewals granted so far (over both transports), and those over POST /v1/renew. A renewal
  // must present the newest generation issued to the node (older: `superseded`).
  int renewals() const;
  int websocket_renewals() const;

  // The secret broker. A secret is bound to a workflow step (both set), to an allocation, or to a
  // host section (workflow "host:<section>", the field as step). Requests are answered with a JWE
  // to their epk once their node_sig verifies with the session's client certificate.
  struct SecretBinding {
    std::string workflow_id, step_id, allocation_id;
  };
  void AddSecret(const std::string& ref, const std::string& value, SecretBinding binding);
  // Every secret and workload-token request is refused with `error` ("" answers again).
  void RefuseSecrets(const std::string& error);
  // Sessions of `node_id` are tenant-controlled: always access-denied.
  void SetTenantControlled(const std::string& node_id, bool tenant);
  // How answers go wrong, for the tests of the checks bcd makes.
  enum class SecretFault { kNone, kWrongRef, kWrongRid, kWrongTyp, kExpired, kNoAnswer };
  void SetSecretFault(SecretFault fault);
  // Answers come this late (from another thread).
  void DelaySecretAnswers(std::chrono::milliseconds delay);
  // Requests whose node_sig did not verify (answered access-denied).
  int bad_node_sigs() const;
  // node_sig is checked against this key instead of the session's certificate (a test of the
  // check itself).
  void VerifyNodeSigsWith(const pki::PublicKey& key);
  // The workload-token issuer: tokens for `instance_id` when its allocation holds it.
  void AllowWorkloadTokens(const std::string& instance_id);
  // Sends an answer to nothing on the open session of `node_id`.
  bool PushStraySecretAnswer(const std::string& node_id);

  struct State;

 private:
  DevGateway() = default;
  std::shared_ptr<State> state_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<class AgentGatewayService> service_;
  std::unique_ptr<WsListener> ws_listener_;
  bool PushFrame(const std::string& node_id, const bettercompute::agent::v1::ServerFrame& frame,
                 bool filtered);
  int port_ = 0;
};

}  // namespace bcd::testing
