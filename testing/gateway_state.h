#pragma once

// Inside the dev gateway: its shared state, the stream both transports' sessions run on, and the
// AgentGateway service, whose parts live by concern in gateway_identity.cc (Join, Renew),
// gateway_session.cc (Session, Tunnel, secrets) and gateway_websocket.cc (the WebSocket origin).
// Only those files and dev_gateway.cc include it.

#include <atomic>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <set>
#include <thread>

#include "bettercompute/agent/v1/session.grpc.pb.h"
#include "proto/frame_codec.h"
#include "proto/version.h"
#include "testing/dev_gateway.h"
#include "testing/ws_server.h"
#include "transport/websocket.h"

namespace bcd::testing {

namespace v1 = bettercompute::agent::v1;

struct JoinToken {
  std::string node_id;
  int64_t expires_at = 0;
  bool used = false;
  std::string deferred_csr;  // the CSR a deferral asked to see again
};

// One session stream as the gateway holds it: gRPC, or a WebSocket (signed intent only).
class GatewayStream {
 public:
  virtual ~GatewayStream() = default;
  virtual bool Read(v1::AgentFrame* frame) = 0;
  virtual bool Write(const v1::ServerFrame& frame) = 0;
  virtual void Cancel() = 0;
  // Ended by a cancel or a broken connection rather than the node's clean end.
  virtual bool broken() const = 0;
  virtual bool signed_only() const = 0;
};

class GrpcGatewayStream final : public GatewayStream {
 public:
  GrpcGatewayStream(grpc::ServerContext* context,
                    grpc::ServerReaderWriter<v1::ServerFrame, v1::AgentFrame>* stream)
      : context_(context), stream_(stream) {}
  bool Read(v1::AgentFrame* frame) override { return stream_->Read(frame); }
  bool Write(const v1::ServerFrame& frame) override { return stream_->Write(frame); }
  void Cancel() override { context_->TryCancel(); }
  bool broken() const override { return context_->IsCancelled(); }
  bool signed_only() const override { return false; }

 private:
  grpc::ServerContext* context_;
  grpc::ServerReaderWriter<v1::ServerFrame, v1::AgentFrame>* stream_;
};

class WsGatewayStream final : public GatewayStream {
 public:
  explicit WsGatewayStream(std::unique_ptr<WsConnection> connection)
      : connection_(std::move(connection)) {}
  bool Read(v1::AgentFrame* frame) override {
    std::string message;
    bool text = false;
    if (!connection_->Read(&message, &text)) return false;
    if (text || !proto::DecodeMessage(message, frame).ok()) {
      connection_->Close(text ? 1003 : 1007, text ? "text message" : "malformed frame");
      broken_ = true;
      return false;
    }
    return true;
  }
  bool Write(const v1::ServerFrame& frame) override {
    absl::StatusOr<std::string> bytes = proto::EncodeMessage(frame);
    return bytes.ok() && connection_->WriteBinary(*bytes);
  }
  void Cancel() override {
    broken_ = true;
    connection_->Abort();
  }
  bool broken() const override { return broken_ || !connection_->closed_by_peer(); }
  bool signed_only() const override { return true; }
  WsConnection& connection() { return *connection_; }

 private:
  std::unique_ptr<WsConnection> connection_;
  std::atomic<bool> broken_{false};
};

struct OpenSession {
  GatewayStream* stream;
  std::mutex write_mu;
};

// Intent a WebSocket session never carries: the gateway keeps it pending.
inline bool UnsignedIntent(const v1::ServerFrame& frame) {
  return (frame.has_command() && !frame.command().has_signature()) ||
         (frame.has_desired_state() && !frame.desired_state().has_signature());
}

// What ended (or refused) a session: OK, or a status with x-bc-reason.
struct Outcome {
  grpc::StatusCode code = grpc::StatusCode::OK;
  std::string reason;
  std::string message;
  int64_t pushback_ms = 0;
};

struct DevTunnel::Impl {
  std::string id, node, ticket;
  std::mutex mu;
  std::condition_variable cv;
  grpc::ServerContext* context = nullptr;                                        // guarded by mu
  grpc::ServerReaderWriter<v1::TunnelFrame, v1::TunnelFrame>* stream = nullptr;  // guarded by mu
  bool opened = false;                                                           // guarded by mu
  bool ended = false;                                                            // guarded by mu
  int writers = 0;  // guarded by mu: writes in progress, which the stream outlives
  std::deque<v1::TunnelFrame> queue;  // guarded by mu
  static constexpr std::size_t kQueue = 4;
  std::mutex write_mu;  // one write at a time; mu is not held while a write waits on the node

  bool Write(const v1::TunnelFrame& frame) {
    grpc::ServerReaderWriter<v1::TunnelFrame, v1::TunnelFrame>* to;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stream == nullptr || ended) return false;
      to = stream;
      ++writers;
    }
    bool written;
    {
      std::lock_guard<std::mutex> lock(write_mu);
      written = to->Write(frame);
    }
    std::lock_guard<std::mutex> lock(mu);
    --writers;
    cv.notify_all();
    return written;
  }
};

struct DevGateway::State {
  const DevPki* pki;
  proto::ProtocolRange range = proto::kProtocolVersion;
  mutable std::condition_variable cv;
  std::map<std::string, v1::Hello> hellos;                               // guarded by mu
  std::map<std::string, std::vector<v1::AgentFrame>> received;           // guarded by mu
  std::map<std::string, std::shared_ptr<OpenSession>> open;              // guarded by mu
  std::vector<std::string> session_nodes;                                // guarded by mu
  int welcomes = 0;                                                      // guarded by mu
  int clean_ends = 0;                                                    // guarded by mu
  int refuse_count = 0;                                                  // guarded by mu
  int refuse_code = 0;                                                   // guarded by mu
  std::string refuse_reason;                                             // guarded by mu
  int64_t refuse_pushback_ms = 0;                                        // guarded by mu
  int next_session = 1;                                                  // guarded by mu
  bool withhold_acks = false;                                            // guarded by mu
  int withhold_welcomes = 0;                                             // guarded by mu
  int frames_after_bad_proof = 0;                                        // guarded by mu
  int renewals = 0;                                                      // guarded by mu
  std::map<std::string, std::vector<int64_t>> ws_renewal_times;          // guarded by mu
  std::map<std::string, std::vector<v1::ServerFrame>> pending_unsigned;  // guarded by mu
  std::map<std::string, std::string> transports;  // node -> last transport; mu
  std::map<std::string, int> ws_close_codes;      // guarded by mu
  DevGateway::WsFault ws_fault{};                 // guarded by mu
  int ws_fault_count = 0;                         // guarded by mu
  std::set<std::string> ws_nonces;                // guarded by mu
  bool stopping = false;                          // guarded by mu
  struct Secret {
    std::string value;
    DevGateway::SecretBinding binding;
  };
  std::map<std::string, Secret> secrets;       // by ref; guarded by mu
  std::string secret_refusal;                  // guarded by mu
  std::set<std::string> tenant_nodes;          // guarded by mu
  DevGateway::SecretFault secret_fault{};      // guarded by mu
  std::chrono::milliseconds secret_delay{0};   // guarded by mu
  int bad_node_sigs = 0;                       // guarded by mu
  std::optional<pki::PublicKey> node_sig_key;  // guarded by mu
  std::set<std::string> workload_instances;    // guarded by mu
  pki::PrivateKey workload_issuer = *pki::PrivateKey::Generate();
  std::set<std::string> renew_nonces;                               // guarded by mu
  std::set<std::string> revoked;                                    // node ids; guarded by mu
  std::map<std::string, std::string> session_ids;                   // node -> sid; mu
  std::map<std::string, std::shared_ptr<DevTunnel::Impl>> tunnels;  // by id; guarded by mu
  int next_tunnel = 1;                                              // guarded by mu
  pki::PrivateKey access_key = *pki::PrivateKey::Generate();
  std::map<std::string, uint64_t> generations;  // the newest generation issued; guarded by mu
  DevGatewayOptions options;
  mutable std::mutex mu;
  std::map<std::string, JoinToken> tokens;  // guarded by mu
  std::map<std::string, std::string>
      credentials;             // node id -> provisioning credential, guarded by mu
  int defer_count = 0;         // guarded by mu
  uint32_t defer_seconds = 0;  // guarded by mu
  int granted = 0;             // guarded by mu
  int calls = 0;               // guarded by mu

  int64_t Now() const {
    return options.now ? options.now() : static_cast<int64_t>(std::time(nullptr));
  }
};

// A refusal as the protocol makes them: a status with x-bc-reason (and pushback when given).
grpc::Status Refuse(grpc::ServerContext* context, grpc::StatusCode code, const std::string& reason,
                    const std::string& message);
grpc::Status Refuse(grpc::ServerContext* context, const Outcome& outcome);
// An outcome as an HTTP answer: the status gRPC would map it to, grpc-status, x-bc-reason and
// pushback.
transport::HttpAnswer HttpRefusal(const Outcome& outcome);

class AgentGatewayService final : public v1::AgentGateway::Service {
 public:
  explicit AgentGatewayService(std::shared_ptr<DevGateway::State> state)
      : state_(std::move(state)) {}

  grpc::Status Join(grpc::ServerContext* context, const v1::JoinRequest* request,
                    v1::JoinResponse* response) override;

  grpc::Status Renew(grpc::ServerContext* context, const v1::RenewRequest* request,
                     v1::RenewResponse* response) override;

  // The checks of Renew that do not depend on the transport: the chain leads to the node CA, the
  // timestamp is within 60 s, the nonce is new, the proof verifies with the current leaf; then a
  // certificate for the CSR's key, one generation up. Over WebSocket (no TLS identity) a node
  // also gets at most 6 renewals an hour.
  Outcome RenewChecked(const v1::RenewRequest& request, v1::RenewResponse* response,
                       bool rate_limited);

  grpc::Status Session(grpc::ServerContext* context,
                       grpc::ServerReaderWriter<v1::ServerFrame, v1::AgentFrame>* stream) override;

  // The node's side of a tunnel: its first frame names the tunnel the gateway asked for; then
  // this thread reads the node's frames into the operator's queue (4 at most: it waits when full).
  grpc::Status Tunnel(grpc::ServerContext* context,
                      grpc::ServerReaderWriter<v1::TunnelFrame, v1::TunnelFrame>* stream) override;

  // `revoked` for a revoked node, else the refusal the test asked for, if one is due.
  std::optional<Outcome> TakeRefusal(const std::string& node);

  // Hello, Welcome, then frames until the stream ends: the same on both transports.
  Outcome RunSession(GatewayStream& stream, const std::string& node, const pki::Certificate& cert,
                     const std::string& transport_name);

  // One request to the WebSocket listener: POST /v1/renew, or a session upgrade.
  void ServeWebSocket(WsExchange& exchange);

 private:
  // The broker's answer to a secret or workload-token request; nullopt when the fault says none.
  std::optional<v1::ServerFrame> AnswerSecret(const std::string& node, const pki::Certificate& cert,
                                              const v1::AgentFrame& frame);

  std::shared_ptr<DevGateway::State> state_;
};

}  // namespace bcd::testing
