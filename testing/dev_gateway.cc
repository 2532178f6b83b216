#include "testing/dev_gateway.h"

#include <atomic>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <set>
#include <thread>

#include "bettercompute/agent/v1/session.grpc.pb.h"
#include "fmt/format.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "nlohmann/json.hpp"
#include "pki/base64url.h"
#include "pki/envelope.h"
#include "pki/jwe.h"
#include "pki/jwt.h"
#include "proto/absl_compat.h"
#include "proto/frame_codec.h"
#include "proto/signing_input.h"
#include "proto/version.h"
#include "testing/ws_server.h"
#include "transport/tls.h"
#include "transport/websocket.h"
#include "transport/ws_auth.h"

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
bool UnsignedIntent(const v1::ServerFrame& frame) {
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

namespace {

// A refusal as the protocol makes them: a status with x-bc-reason (and pushback when given).
grpc::Status Refuse(grpc::ServerContext* context, grpc::StatusCode code, const std::string& reason,
                    const std::string& message) {
  context->AddTrailingMetadata("x-bc-reason", reason);
  return grpc::Status(code, message);
}

grpc::Status Refuse(grpc::ServerContext* context, const Outcome& outcome) {
  if (outcome.pushback_ms > 0) {
    context->AddTrailingMetadata("grpc-retry-pushback-ms", std::to_string(outcome.pushback_ms));
  }
  return Refuse(context, outcome.code, outcome.reason, outcome.message);
}

// An outcome as an HTTP answer: the status gRPC would map it to, grpc-status, x-bc-reason and
// pushback.
transport::HttpAnswer HttpRefusal(const Outcome& outcome) {
  unsigned status = 400;
  switch (outcome.code) {
    case grpc::StatusCode::UNAUTHENTICATED:
      status = 401;
      break;
    case grpc::StatusCode::PERMISSION_DENIED:
      status = 403;
      break;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      status = 429;
      break;
    case grpc::StatusCode::UNAVAILABLE:
      status = 503;
      break;
    case grpc::StatusCode::UNIMPLEMENTED:
      status = 404;
      break;
    default:
      break;
  }
  transport::HttpAnswer answer;
  answer.status = status;
  answer.headers["content-type"] = "text/plain";
  answer.headers["grpc-status"] = std::to_string(static_cast<int>(outcome.code));
  answer.headers["x-bc-reason"] = outcome.reason;
  if (outcome.pushback_ms > 0) {
    answer.headers["grpc-retry-pushback-ms"] = std::to_string(outcome.pushback_ms);
  }
  answer.body = outcome.message;
  return answer;
}

}  // namespace

class AgentGatewayService final : public v1::AgentGateway::Service {
 public:
  explicit AgentGatewayService(std::shared_ptr<DevGateway::State> state)
      : state_(std::move(state)) {}

  grpc::Status Join(grpc::ServerContext* context, const v1::JoinRequest* request,
                    v1::JoinResponse* response) override {
    std::lock_guard<std::mutex> lock(state_->mu);
    ++state_->calls;
    std::string token_key = request->evidence();
    if (request->attestor() == "provisioned") {
      // A provisioning credential is spent like a token: it becomes one, bound to its node.
      auto credential = state_->credentials.find(request->node_id());
      if (credential == state_->credentials.end() || credential->second != request->evidence()) {
        return Refuse(context, grpc::StatusCode::UNAUTHENTICATED, "invalid-credential",
                      "no such provisioning credential for this node");
      }
      token_key = "provisioned:" + request->node_id() + ":" + request->evidence();
      state_->tokens.try_emplace(token_key,
                                 JoinToken{request->node_id(), state_->Now() + 3600, false, ""});
    } else if (request->attestor() != "join-token") {
      return Refuse(context, grpc::StatusCode::INVALID_ARGUMENT, "unsupported-attestor",
                    "the dev gateway knows the join-token and provisioned attestors");
    }
    if (request->role() != bettercompute::common::v1::ROLE_NODE &&
        request->role() != bettercompute::common::v1::ROLE_SITE) {
      return Refuse(context, grpc::StatusCode::INVALID_ARGUMENT, "bad-role",
                    "role must be node or site");
    }
    auto it = state_->tokens.find(token_key);
    if (it == state_->tokens.end()) {
      return Refuse(context, grpc::StatusCode::UNAUTHENTICATED, "invalid-token",
                    "unknown join token");
    }
    JoinToken& token = it->second;
    if (token.used)
      return Refuse(context, grpc::StatusCode::UNAUTHENTICATED, "token-used",
                    "the join token was used");
    if (token.expires_at <= state_->Now()) {
      return Refuse(context, grpc::StatusCode::UNAUTHENTICATED, "token-expired",
                    "the join token expired");
    }
    if (!token.deferred_csr.empty() && token.deferred_csr != request->csr()) {
      return Refuse(context, grpc::StatusCode::INVALID_ARGUMENT, "csr-changed",
                    "a deferred join must come back with the same CSR");
    }
    absl::StatusOr<pki::PublicKey> key = pki::VerifyCsr(request->csr());
    if (!key.ok()) {
      return Refuse(context, grpc::StatusCode::INVALID_ARGUMENT, "bad-csr",
                    std::string(ToStd(key.status().message())));
    }
    v1::JoinResponseBody body;
    if (state_->defer_count > 0) {
      --state_->defer_count;
      token.deferred_csr = request->csr();
      body.mutable_deferral()->set_retry_after_seconds(state_->defer_seconds);
      body.mutable_deferral()->set_reason("deferred by the dev gateway");
    } else {
      absl::StatusOr<pki::Certificate> leaf = state_->pki->IssueNode(
          *key, token.node_id, 1, state_->Now(), state_->options.node_cert_lifetime);
      if (!leaf.ok())
        return grpc::Status(grpc::StatusCode::INTERNAL,
                            std::string(ToStd(leaf.status().message())));
      token.used = true;
      ++state_->granted;
      state_->generations[token.node_id] = 1;
      v1::JoinGrant* grant = body.mutable_grant();
      grant->add_certificate_chain(leaf->Der());
      grant->add_certificate_chain(state_->pki->node_ca().Der());
      *grant->mutable_trust_bundle() =
          state_->pki->SignedBundle(1, state_->options.command_signing);
      grant->set_node_id(token.node_id);
      grant->set_spiffe_id(std::string("spiffe://") + DevPki::kTrustDomain + "/site/" +
                           DevPki::kSite + "/node/" + token.node_id);
      grant->set_join_service_key(state_->pki->join_service_key().Public().SpkiDer());
    }
    response->set_body(body.SerializeAsString());
    *response->mutable_signature() =
        *pki::Sign(proto::BodySigningInput(proto::Purpose::kJoinResponse, response->body()),
                   state_->pki->join_service_key(), "join");
    return grpc::Status::OK;
  }

  grpc::Status Renew(grpc::ServerContext* context, const v1::RenewRequest* request,
                     v1::RenewResponse* response) override {
    std::vector<grpc::string_ref> pems =
        context->auth_context()->FindPropertyValues("x509_pem_cert");
    if (pems.empty()) {
      return Refuse(context, grpc::StatusCode::UNAUTHENTICATED, "no-client-certificate",
                    "Renew needs mutual TLS");
    }
    absl::StatusOr<pki::Certificate> peer =
        pki::Certificate::FromPem(std::string(pems[0].data(), pems[0].size()));
    if (!peer.ok() || request->chain().empty() || request->chain(0) != peer->Der()) {
      return Refuse(context, grpc::StatusCode::PERMISSION_DENIED, "chain-mismatch",
                    "the chain is not the caller's TLS identity");
    }
    Outcome outcome = RenewChecked(*request, response, /*rate_limited=*/false);
    if (outcome.code != grpc::StatusCode::OK) return Refuse(context, outcome);
    return grpc::Status::OK;
  }

  // The checks of Renew that do not depend on the transport: the chain leads to the node CA, the
  // timestamp is within 60 s, the nonce is new, the proof verifies with the current leaf; then a
  // certificate for the CSR's key, one generation up. Over WebSocket (no TLS identity) a node
  // also gets at most 6 renewals an hour.
  Outcome RenewChecked(const v1::RenewRequest& request, v1::RenewResponse* response,
                       bool rate_limited) {
    auto refuse = [](grpc::StatusCode code, std::string reason, std::string message) {
      return Outcome{code, std::move(reason), std::move(message)};
    };
    absl::StatusOr<std::vector<pki::Certificate>> chain =
        pki::ParseDerChain({request.chain().begin(), request.chain().end()});
    if (!chain.ok()) {
      return refuse(grpc::StatusCode::PERMISSION_DENIED, "bad-chain",
                    std::string(ToStd(chain.status().message())));
    }
    std::lock_guard<std::mutex> lock(state_->mu);
    int64_t now = state_->Now();
    if (absl::Status s = pki::VerifyChain(*chain, {state_->pki->node_ca()}, now); !s.ok()) {
      return refuse(grpc::StatusCode::PERMISSION_DENIED, "bad-chain",
                    std::string(ToStd(s.message())));
    }
    if (std::llabs(static_cast<long long>(request.timestamp()) - now) > 60) {
      return refuse(grpc::StatusCode::PERMISSION_DENIED, "stale",
                    "the timestamp is not within 60 s");
    }
    absl::StatusOr<pki::PublicKey> current = chain->front().Key();
    if (!current.ok() ||
        !current->VerifyEs256(proto::RenewSigningInput(request), request.proof()).ok()) {
      return refuse(grpc::StatusCode::PERMISSION_DENIED, "bad-proof", "the proof does not verify");
    }
    if (request.nonce().size() != 16 || !state_->renew_nonces.insert(request.nonce()).second) {
      return refuse(grpc::StatusCode::PERMISSION_DENIED, "replay", "the nonce was seen before");
    }
    absl::StatusOr<pki::PublicKey> key = pki::VerifyCsr(request.csr());
    absl::StatusOr<pki::NodeIdentity> identity = pki::IdentityOf(chain->front());
    if (!key.ok() || !identity.ok()) {
      return refuse(grpc::StatusCode::INVALID_ARGUMENT, "bad-csr",
                    "the CSR or identity is malformed");
    }
    std::string node = identity->id.node();
    if (state_->revoked.contains(node)) {
      return refuse(grpc::StatusCode::PERMISSION_DENIED, "revoked", "this node is revoked");
    }
    // Only the newest certificate renews: an older one (a copy taken before a renewal) is refused.
    uint64_t generation = identity->generation.value_or(0);
    if (auto it = state_->generations.find(node);
        it != state_->generations.end() && generation < it->second) {
      return refuse(
          grpc::StatusCode::PERMISSION_DENIED, "superseded",
          fmt::format("generation {} was replaced by generation {}", generation, it->second));
    }
    if (rate_limited) {
      std::vector<int64_t>& times = state_->ws_renewal_times[node];
      std::erase_if(times, [&](int64_t t) { return t <= now - 3600; });
      if (times.size() >= 6) {
        Outcome limited = refuse(grpc::StatusCode::RESOURCE_EXHAUSTED, "rate-limited",
                                 "6 renewals an hour per node");
        limited.pushback_ms = (times.front() + 3600 - now) * 1000;
        return limited;
      }
      times.push_back(now);
    }
    absl::StatusOr<pki::Certificate> leaf =
        state_->pki->IssueNode(*key, node, generation + 1, now, state_->options.node_cert_lifetime);
    if (!leaf.ok()) {
      return refuse(grpc::StatusCode::INTERNAL, "internal",
                    std::string(ToStd(leaf.status().message())));
    }
    state_->generations[node] = generation + 1;
    response->add_certificate_chain(leaf->Der());
    response->add_certificate_chain(state_->pki->node_ca().Der());
    ++state_->renewals;
    state_->cv.notify_all();
    return {};
  }

  grpc::Status Session(grpc::ServerContext* context,
                       grpc::ServerReaderWriter<v1::ServerFrame, v1::AgentFrame>* stream) override {
    // The node id comes from the client certificate's SPIFFE SAN, never from a frame.
    std::vector<grpc::string_ref> pems =
        context->auth_context()->FindPropertyValues("x509_pem_cert");
    if (pems.empty()) {
      return Refuse(context, grpc::StatusCode::UNAUTHENTICATED, "no-client-certificate",
                    "Session needs a node certificate");
    }
    absl::StatusOr<pki::Certificate> cert =
        pki::Certificate::FromPem(std::string(pems[0].data(), pems[0].size()));
    absl::StatusOr<pki::NodeIdentity> identity =
        cert.ok() ? pki::IdentityOf(*cert) : absl::StatusOr<pki::NodeIdentity>(cert.status());
    if (!identity.ok()) {
      return Refuse(context, grpc::StatusCode::UNAUTHENTICATED, "bad-identity",
                    std::string(ToStd(identity.status().message())));
    }
    if (std::optional<Outcome> refused = TakeRefusal(identity->id.node())) {
      return Refuse(context, *refused);
    }
    GrpcGatewayStream gateway_stream(context, stream);
    Outcome outcome = RunSession(gateway_stream, identity->id.node(), *cert, "grpc");
    if (outcome.code != grpc::StatusCode::OK) return Refuse(context, outcome);
    return grpc::Status::OK;
  }

  // The node's side of a tunnel: its first frame names the tunnel the gateway asked for; then
  // this thread reads the node's frames into the operator's queue (4 at most: it waits when full).
  grpc::Status Tunnel(grpc::ServerContext* context,
                      grpc::ServerReaderWriter<v1::TunnelFrame, v1::TunnelFrame>* stream) override {
    std::vector<grpc::string_ref> pems =
        context->auth_context()->FindPropertyValues("x509_pem_cert");
    absl::StatusOr<pki::Certificate> cert =
        pems.empty() ? absl::StatusOr<pki::Certificate>(absl::UnauthenticatedError("none"))
                     : pki::Certificate::FromPem(std::string(pems[0].data(), pems[0].size()));
    absl::StatusOr<pki::NodeIdentity> identity =
        cert.ok() ? pki::IdentityOf(*cert) : absl::StatusOr<pki::NodeIdentity>(cert.status());
    if (!identity.ok()) {
      return Refuse(context, grpc::StatusCode::UNAUTHENTICATED, "no-client-certificate",
                    "Tunnel needs a node certificate");
    }
    v1::TunnelFrame first;
    if (!stream->Read(&first) || !first.has_opened()) {
      return Refuse(context, grpc::StatusCode::INVALID_ARGUMENT, "expected-opened",
                    "the first frame must be opened");
    }
    std::shared_ptr<DevTunnel::Impl> tunnel;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      auto it = state_->tunnels.find(first.opened().tunnel_id());
      if (it == state_->tunnels.end() || it->second->node != identity->id.node()) {
        return Refuse(context, grpc::StatusCode::NOT_FOUND, "unknown-tunnel",
                      "no tunnel of this node has that id");
      }
      tunnel = it->second;
    }
    {
      std::lock_guard<std::mutex> lock(tunnel->mu);
      tunnel->context = context;
      tunnel->stream = stream;
      tunnel->opened = true;
    }
    tunnel->cv.notify_all();
    v1::TunnelFrame frame;
    while (stream->Read(&frame)) {
      std::unique_lock<std::mutex> lock(tunnel->mu);
      tunnel->cv.wait(lock, [&] {
        return tunnel->queue.size() < DevTunnel::Impl::kQueue || tunnel->ended ||
               context->IsCancelled();
      });
      if (tunnel->ended) break;
      tunnel->queue.push_back(frame);
      tunnel->cv.notify_all();
    }
    std::unique_lock<std::mutex> lock(tunnel->mu);
    tunnel->ended = true;
    if (tunnel->writers > 0) context->TryCancel();  // a write blocked on flow control returns
    tunnel->cv.wait(lock, [&] { return tunnel->writers == 0; });
    tunnel->stream = nullptr;
    tunnel->context = nullptr;
    tunnel->cv.notify_all();
    return grpc::Status::OK;
  }

  // `revoked` for a revoked node, else the refusal the test asked for, if one is due.
  std::optional<Outcome> TakeRefusal(const std::string& node) {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->revoked.contains(node)) {
      return Outcome{grpc::StatusCode::PERMISSION_DENIED, "revoked", "this node is revoked"};
    }
    if (state_->refuse_count <= 0) return std::nullopt;
    --state_->refuse_count;
    return Outcome{static_cast<grpc::StatusCode>(state_->refuse_code), state_->refuse_reason,
                   "refused by the dev gateway", state_->refuse_pushback_ms};
  }

  // Hello, Welcome, then frames until the stream ends: the same on both transports.
  Outcome RunSession(GatewayStream& stream, const std::string& node, const pki::Certificate& cert,
                     const std::string& transport_name) {
    v1::AgentFrame first;
    if (!stream.Read(&first) || !first.has_hello()) {
      return {grpc::StatusCode::INVALID_ARGUMENT, "expected-hello",
              "the first frame must be Hello"};
    }
    absl::StatusOr<proto::ProtocolRange> daemon =
        proto::ProtocolRange::Make(first.hello().proto_min(), first.hello().proto_max());
    absl::StatusOr<proto::Negotiated> negotiated =
        daemon.ok() ? proto::Negotiate(state_->range, *daemon)
                    : absl::StatusOr<proto::Negotiated>(daemon.status());
    if (!negotiated.ok()) {
      return {grpc::StatusCode::FAILED_PRECONDITION, "protocol-version",
              std::string(ToStd(negotiated.status().message()))};
    }
    {
      std::unique_lock<std::mutex> lock(state_->mu);
      if (state_->withhold_welcomes > 0) {
        // Hello is read and never answered: the node must give up on this session by itself.
        --state_->withhold_welcomes;
        lock.unlock();
        v1::AgentFrame ignored;
        while (stream.Read(&ignored)) {
        }
        return {};
      }
    }
    auto session = std::make_shared<OpenSession>();
    session->stream = &stream;
    v1::ServerFrame welcome;
    std::vector<v1::ServerFrame> held;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      welcome.mutable_welcome()->set_protocol_version(negotiated->protocol_version);
      welcome.mutable_welcome()->set_upgrade_required(negotiated->upgrade_required);
      welcome.mutable_welcome()->set_session_id("dev-session-" +
                                                std::to_string(state_->next_session++));
      welcome.mutable_welcome()->set_server_time(static_cast<uint64_t>(state_->Now()));
      state_->hellos[node] = first.hello();
      state_->session_ids[node] = welcome.welcome().session_id();
      state_->received[node].clear();
      state_->open[node] = session;
      state_->session_nodes.push_back(node);
      state_->transports[node] = transport_name;
      // Intent held for a signed-only session is still held; a gRPC session takes it now.
      if (!stream.signed_only()) held.swap(state_->pending_unsigned[node]);
    }
    {
      std::lock_guard<std::mutex> lock(session->write_mu);
      stream.Write(welcome);
      for (const v1::ServerFrame& frame : held) stream.Write(frame);
    }
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      ++state_->welcomes;
    }
    state_->cv.notify_all();
    v1::AgentFrame frame;
    while (stream.Read(&frame)) {
      uint64_t seq = frame.has_event()            ? frame.event().seq()
                     : frame.has_command_update() ? frame.command_update().seq()
                                                  : 0;
      bool ack = false;
      if (state_->options.on_frame) state_->options.on_frame(node, frame);
      {
        std::lock_guard<std::mutex> lock(state_->mu);
        state_->received[node].push_back(frame);
        ack = seq != 0 && !state_->withhold_acks;
        state_->cv.notify_all();
      }
      // Answered after it is recorded: what a test sees received precedes the answer.
      if (frame.has_secret_request() || frame.has_workload_token_request()) {
        std::optional<v1::ServerFrame> answer = AnswerSecret(node, cert, frame);
        std::chrono::milliseconds delay;
        {
          std::lock_guard<std::mutex> lock(state_->mu);
          delay = state_->secret_delay;
        }
        if (answer && delay.count() > 0) {
          std::thread([session, delay, frame = *answer] {
            std::this_thread::sleep_for(delay);
            std::lock_guard<std::mutex> lock(session->write_mu);
            if (session->stream != nullptr) session->stream->Write(frame);
          }).detach();
        } else if (answer) {
          std::lock_guard<std::mutex> lock(session->write_mu);
          stream.Write(*answer);
        }
      }
      if (ack) {
        v1::ServerFrame reply;
        reply.mutable_ack()->set_up_to_seq(seq);
        std::lock_guard<std::mutex> lock(session->write_mu);
        stream.Write(reply);
      }
    }
    {
      std::lock_guard<std::mutex> lock(session->write_mu);
      session->stream =
          nullptr;  // a Push racing the end finds no stream rather than a dangling one
    }
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->open[node] == session) state_->open.erase(node);
    if (!stream.broken()) ++state_->clean_ends;
    state_->cv.notify_all();
    return {};
  }

  // One request to the WebSocket listener: POST /v1/renew, or a session upgrade.
  void ServeWebSocket(WsExchange& exchange) {
    const HttpRequestInfo& request = exchange.request();
    auto refuse = [&](const Outcome& outcome) { exchange.Answer(HttpRefusal(outcome)); };
    if (request.target == "/v1/renew") {
      if (request.method != "POST") {
        return refuse({grpc::StatusCode::UNIMPLEMENTED, "method", "POST /v1/renew"});
      }
      if (request.headers.count("content-type") == 0 ||
          request.headers.at("content-type") != "application/x-protobuf") {
        return refuse({grpc::StatusCode::INVALID_ARGUMENT, "content-type",
                       "the body is a RenewRequest as application/x-protobuf"});
      }
      if (request.body.size() > 64 * 1024) {
        return refuse(
            {grpc::StatusCode::INVALID_ARGUMENT, "too-large", "a renew request is at most 64 KiB"});
      }
      v1::RenewRequest renew;
      if (!proto::DecodeMessage(request.body, &renew).ok()) {
        return refuse({grpc::StatusCode::INVALID_ARGUMENT, "malformed", "not a RenewRequest"});
      }
      v1::RenewResponse response;
      Outcome outcome = RenewChecked(renew, &response, /*rate_limited=*/true);
      if (outcome.code != grpc::StatusCode::OK) return refuse(outcome);
      transport::HttpAnswer answer;
      answer.headers["content-type"] = "application/x-protobuf";
      answer.body = response.SerializeAsString();
      return exchange.Answer(answer);
    }
    if (request.target != "/v1/session" || !request.upgrade) {
      return refuse({grpc::StatusCode::UNIMPLEMENTED, "not-found",
                     "the WebSocket origin serves /v1/session and /v1/renew"});
    }
    int64_t now = state_->Now();
    absl::StatusOr<transport::UpgradingNode> node =
        transport::VerifyNodeUpgrade(request.headers, {state_->pki->node_ca()}, request.host, now);
    if (!node.ok()) {
      return refuse({absl::IsPermissionDenied(node.status()) ? grpc::StatusCode::PERMISSION_DENIED
                                                             : grpc::StatusCode::UNAUTHENTICATED,
                     "bad-node-proof", std::string(ToStd(node.status().message()))});
    }
    DevGateway::WsFault fault;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (!state_->ws_nonces.insert(node->nonce).second) {
        return refuse({grpc::StatusCode::UNAUTHENTICATED, "replay", "the nonce was seen before"});
      }
      fault = state_->ws_fault_count > 0 ? state_->ws_fault : DevGateway::WsFault::kNone;
      if (state_->ws_fault_count > 0) --state_->ws_fault_count;
    }
    std::string node_id = node->identity.id.node();
    if (std::optional<Outcome> refused = TakeRefusal(node_id)) return refuse(*refused);
    using Fault = DevGateway::WsFault;
    std::string proof_node = fault == Fault::kProofOtherNode ? "someone-else" : node_id;
    std::string proof_nonce = fault == Fault::kProofOtherNonce ? pki::RandomBytes(16) : node->nonce;
    int64_t iat = fault == Fault::kProofOldIat ? now - 120 : now;
    const pki::PrivateKey* signer = &state_->pki->serving_key();
    std::vector<std::string> chain = {state_->pki->serving_leaf().Der(),
                                      state_->pki->serving_ca().Der()};
    std::optional<DevPki> foreign;
    if (fault == Fault::kProofForeignKey) {
      // A serving certificate with the right name from a CA this node does not pin.
      foreign = *DevPki::Create(now);
      signer = &foreign->serving_key();
      chain = {foreign->serving_leaf().Der(), foreign->serving_ca().Der()};
    }
    std::vector<std::pair<std::string, std::string>> headers;
    if (fault != Fault::kNoProof) {
      headers.emplace_back("x-bc-gateway-proof", *transport::MakeGatewayProof(
                                                     *signer, chain, proof_node, proof_nonce, iat));
    }
    std::unique_ptr<WsConnection> connection = exchange.Accept(headers);
    if (!connection) return;
    WsGatewayStream stream(std::move(connection));
    switch (fault) {
      case Fault::kSilent: {
        // Reads nothing, so the node's pings go unanswered, until the node gives up on it.
        std::unique_lock<std::mutex> lock(state_->mu);
        state_->cv.wait_for(lock, std::chrono::seconds(60), [&] { return state_->stopping; });
        return;
      }
      case Fault::kTextMessage:
      case Fault::kOversizedMessage:
      case Fault::kBadMask: {
        // After Welcome, so the node is past the handshake when the bad message comes.
        v1::AgentFrame hello;
        if (!stream.Read(&hello)) return;
        v1::ServerFrame welcome;
        welcome.mutable_welcome()->set_protocol_version(1);
        welcome.mutable_welcome()->set_session_id("dev-faulty");
        stream.Write(welcome);
        if (fault == Fault::kTextMessage) {
          stream.connection().WriteText("{\"hello\":\"text\"}");
        } else if (fault == Fault::kOversizedMessage) {
          // A binary frame header announcing 16 MiB + 1 byte, then the start of its payload.
          std::string header = {'\x82', '\x7f', 0, 0, 0, 0, 1, 0, 0, 1};
          stream.connection().WriteRaw(header + std::string(4096, 'x'));
        } else {
          // A masked frame: a server never masks (RFC 6455 5.1).
          std::string frame = {'\x82', '\x82', 1, 2, 3, 4, 'a' ^ 1, 'b' ^ 2};
          stream.connection().WriteRaw(frame);
        }
        std::string ignored;
        bool text = false;
        while (stream.connection().Read(&ignored, &text)) {
        }
        std::lock_guard<std::mutex> lock(state_->mu);
        state_->ws_close_codes[node_id] = stream.connection().peer_close_code();
        state_->cv.notify_all();
        return;
      }
      case Fault::kProofOtherNode:
      case Fault::kProofOtherNonce:
      case Fault::kProofOldIat:
      case Fault::kProofForeignKey:
      case Fault::kNoProof: {
        // A node must close such a session before it sends anything: count what it sends.
        v1::AgentFrame frame;
        while (stream.Read(&frame)) {
          std::lock_guard<std::mutex> lock(state_->mu);
          ++state_->frames_after_bad_proof;
        }
        std::lock_guard<std::mutex> lock(state_->mu);
        state_->ws_close_codes[node_id] = stream.connection().peer_close_code();
        state_->cv.notify_all();
        return;
      }
      default:
        break;
    }
    Outcome outcome = RunSession(stream, node_id, node->chain.front(), "websocket");
    if (outcome.code != grpc::StatusCode::OK) {
      stream.connection().Close(1008, outcome.reason + ": " + outcome.message);
    }
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->ws_close_codes[node_id] = stream.connection().peer_close_code();
    state_->cv.notify_all();
  }

 private:
  // The broker's answer to a secret or workload-token request; nullopt when the fault says none.
  std::optional<v1::ServerFrame> AnswerSecret(const std::string& node, const pki::Certificate& cert,
                                              const v1::AgentFrame& frame) {
    bool workload = frame.has_workload_token_request();
    const v1::SecretRequest& secret = frame.secret_request();
    const v1::WorkloadTokenRequest& token = frame.workload_token_request();
    std::string input = workload ? proto::WorkloadTokenSigningInput(token)
                                 : proto::SecretRequestSigningInput(secret);
    std::string node_sig = workload ? token.node_sig() : secret.node_sig();
    std::string rid = workload ? token.request_id() : secret.request_id();
    std::string epk = workload ? token.epk() : secret.epk();
    absl::StatusOr<pki::PublicKey> node_key = cert.Key();
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (state_->node_sig_key) node_key = *state_->node_sig_key;
    }
    bool signed_ok = node_key.ok() && node_key->VerifyEs256(input, node_sig).ok();
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->secret_fault == DevGateway::SecretFault::kNoAnswer) return std::nullopt;
    std::string error, plaintext, binding_name, binding_value;
    if (!signed_ok) {
      ++state_->bad_node_sigs;
      error = "access-denied";
    } else if (state_->tenant_nodes.contains(node)) {
      error = "access-denied";
    } else if (!state_->secret_refusal.empty()) {
      error = state_->secret_refusal;
    } else if (workload) {
      if (!state_->workload_instances.contains(token.instance_id())) {
        error = "not-bound";
      } else {
        std::string claims = fmt::format(
            R"({{"iss":"dev","sub":"{}","aud":"{}","iat":{},"exp":{}}})", token.instance_id(),
            token.audience().empty() ? "dev-default" : token.audience(), state_->Now(),
            state_->Now() + 600);
        plaintext = *pki::SignJwt(claims, state_->workload_issuer, "dev-workload");
        binding_name = "iid";
        binding_value = token.instance_id();
      }
    } else {
      auto it = state_->secrets.find(secret.ref());
      if (it == state_->secrets.end()) {
        error = "not-found";
      } else {
        const DevGateway::SecretBinding& b = it->second.binding;
        bool step = !b.workflow_id.empty() && b.workflow_id == secret.workflow_id() &&
                    b.step_id == secret.step_id();
        bool allocation = !b.allocation_id.empty() && b.allocation_id == secret.allocation_id();
        if (!step && !allocation) {
          error = "not-bound";
        } else {
          plaintext = it->second.value;
          binding_name = "ref";
          binding_value = secret.ref();
        }
      }
    }
    v1::ServerFrame answer;
    std::string jwe;
    if (error.empty()) {
      DevGateway::SecretFault fault = state_->secret_fault;
      std::string typ(workload ? pki::kWorkloadJweType : pki::kSecretJweType);
      if (fault == DevGateway::SecretFault::kWrongTyp) typ = "JWT";
      if (fault == DevGateway::SecretFault::kWrongRef) binding_value += "-other";
      std::string bound_rid = fault == DevGateway::SecretFault::kWrongRid ? rid + "-other" : rid;
      int64_t exp =
          fault == DevGateway::SecretFault::kExpired ? state_->Now() - 1 : state_->Now() + 60;
      absl::StatusOr<pki::PublicKey> recipient = pki::PublicKey::FromSec1(epk);
      absl::StatusOr<std::string> sealed =
          recipient.ok() ? pki::SealJwe(plaintext, *recipient, typ,
                                        {{binding_name, binding_value}, {"rid", bound_rid}}, exp)
                         : absl::StatusOr<std::string>(recipient.status());
      if (sealed.ok()) {
        jwe = *sealed;
      } else {
        error = "unavailable";
      }
    }
    if (workload) {
      v1::WorkloadTokenResponse* response = answer.mutable_workload_token_response();
      response->set_request_id(rid);
      response->set_jwe(jwe);
      response->set_error(error);
      if (error.empty()) response->set_expires_at(static_cast<uint64_t>(state_->Now() + 600));
    } else {
      v1::SecretResponse* response = answer.mutable_secret_response();
      response->set_request_id(rid);
      response->set_jwe(jwe);
      response->set_error(error);
    }
    return answer;
  }

  std::shared_ptr<DevGateway::State> state_;
};

absl::StatusOr<std::unique_ptr<DevGateway>> DevGateway::Start(const DevPki& pki,
                                                              DevGatewayOptions options) {
  if (absl::Status s = transport::RequireTls13(); !s.ok()) return s;
  std::unique_ptr<DevGateway> gateway(new DevGateway());
  gateway->state_ = std::make_shared<State>();
  gateway->state_->pki = &pki;
  gateway->state_->options = options;
  absl::StatusOr<proto::ProtocolRange> range = proto::ProtocolRange::Parse(options.protocol);
  if (!range.ok()) return range.status();
  gateway->state_->range = *range;
  gateway->service_ = std::make_unique<AgentGatewayService>(gateway->state_);
  if (!options.websocket_listen.empty()) {
    std::size_t colon = options.websocket_listen.rfind(':');
    int port = std::atoi(options.websocket_listen.substr(colon + 1).c_str());
    absl::StatusOr<std::unique_ptr<WsListener>> listener =
        WsListener::Start({.host = options.websocket_listen.substr(0, colon),
                           .port = static_cast<uint16_t>(port),
                           .key_pem = pki.serving_key().ToPem(),
                           .chain_pem = pki.ServingChainPem(),
                           .max_body = 1024 * 1024},
                          [service = gateway->service_.get()](WsExchange& exchange) {
                            service->ServeWebSocket(exchange);
                          });
    if (!listener.ok()) return listener.status();
    gateway->ws_listener_ = *std::move(listener);
  }
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen,
                           transport::MakeServerCredentials({.key_pem = pki.serving_key().ToPem(),
                                                             .chain_pem = pki.ServingChainPem(),
                                                             .client_ca_pem = pki.node_ca().Pem()}),
                           &gateway->port_);
  transport::ConfigureServerKeepalive(&builder);
  builder.RegisterService(gateway->service_.get());
  gateway->server_ = builder.BuildAndStart();
  if (!gateway->server_ || gateway->port_ == 0) {
    return absl::UnavailableError("the dev gateway cannot listen on " + options.listen);
  }
  return gateway;
}

DevGateway::~DevGateway() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stopping = true;
  }
  state_->cv.notify_all();
  DropSessions();
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    for (auto& [id, tunnel] : state_->tunnels) {
      std::lock_guard<std::mutex> tunnel_lock(tunnel->mu);
      if (tunnel->context != nullptr) tunnel->context->TryCancel();
      tunnel->ended = true;
      tunnel->cv.notify_all();
    }
  }
  ws_listener_.reset();  // joins its connections' threads
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

int DevGateway::websocket_port() const { return ws_listener_ ? ws_listener_->port() : 0; }

std::string DevGateway::WebSocketConfigToml() const {
  return fmt::format("[websocket]\nurl = \"wss://127.0.0.1:{}/v1/session\"\n", websocket_port());
}

void DevGateway::SetWsFault(WsFault fault, int count) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->ws_fault = fault;
  state_->ws_fault_count = count;
}

std::size_t DevGateway::PendingUnsigned(const std::string& node_id) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->pending_unsigned.find(node_id);
  return it == state_->pending_unsigned.end() ? 0 : it->second.size();
}

std::string DevGateway::LastTransport(const std::string& node_id) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->transports.find(node_id);
  return it == state_->transports.end() ? "" : it->second;
}

std::optional<int> DevGateway::WaitForWsClose(const std::string& node_id,
                                              std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(state_->mu);
  if (!state_->cv.wait_for(lock, timeout,
                           [&] { return state_->ws_close_codes.contains(node_id); })) {
    return std::nullopt;
  }
  return state_->ws_close_codes.at(node_id);
}

void DevGateway::ForgetWsClose(const std::string& node_id) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->ws_close_codes.erase(node_id);
}

bool DevGateway::WaitForWelcomes(int count, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(state_->mu);
  return state_->cv.wait_for(lock, timeout, [&] { return state_->welcomes >= count; });
}

bool DevGateway::WaitForNoSession(const std::string& node_id,
                                  std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(state_->mu);
  return state_->cv.wait_for(lock, timeout, [&] { return !state_->open.contains(node_id); });
}

std::optional<v1::Hello> DevGateway::LastHello(const std::string& node_id) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->hellos.find(node_id);
  if (it == state_->hellos.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> DevGateway::SessionNodes() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->session_nodes;
}

std::vector<v1::AgentFrame> DevGateway::Received(const std::string& node_id) const {
  std::lock_guard<std::mutex> lock(state_->mu);
  auto it = state_->received.find(node_id);
  return it == state_->received.end() ? std::vector<v1::AgentFrame>() : it->second;
}

bool DevGateway::WaitForReceived(const std::string& node_id, std::size_t count,
                                 std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(state_->mu);
  return state_->cv.wait_for(lock, timeout, [&] {
    auto it = state_->received.find(node_id);
    return it != state_->received.end() && it->second.size() >= count;
  });
}

bool DevGateway::Push(const std::string& node_id, const v1::ServerFrame& frame) {
  return PushFrame(node_id, frame, /*filtered=*/true);
}

bool DevGateway::PushUnfiltered(const std::string& node_id, const v1::ServerFrame& frame) {
  return PushFrame(node_id, frame, /*filtered=*/false);
}

bool DevGateway::PushUndecodable(const std::string& node_id) {
  // A string field that is not UTF-8: protobuf serializes it, and no conforming parser takes it.
  v1::ServerFrame frame;
  frame.mutable_cancel_command()->set_command_id(std::string("\xff\xfe") + " not utf-8");
  return PushFrame(node_id, frame, /*filtered=*/false);
}

int DevGateway::FramesAfterBadProof() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->frames_after_bad_proof;
}

void DevGateway::WithholdWelcomes(int count) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->withhold_welcomes = count;
}

bool DevGateway::PushFrame(const std::string& node_id, const v1::ServerFrame& frame,
                           bool filtered) {
  std::shared_ptr<OpenSession> session;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    auto it = state_->open.find(node_id);
    if (it == state_->open.end()) return false;
    session = it->second;
  }
  std::lock_guard<std::mutex> lock(session->write_mu);
  if (session->stream == nullptr) return false;
  if (filtered && session->stream->signed_only() && UnsignedIntent(frame)) {
    // A signed-only session never carries it: it waits for a session that may.
    std::lock_guard<std::mutex> state_lock(state_->mu);
    state_->pending_unsigned[node_id].push_back(frame);
    return true;
  }
  return session->stream->Write(frame);
}

void DevGateway::RefuseSessions(int count, int code, const std::string& reason,
                                int64_t pushback_ms) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->refuse_count = count;
  state_->refuse_code = code;
  state_->refuse_reason = reason;
  state_->refuse_pushback_ms = pushback_ms;
}

void DevGateway::DropSessions() {
  std::vector<std::shared_ptr<OpenSession>> open;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    for (auto& [node, session] : state_->open) open.push_back(session);
  }
  for (auto& session : open) {
    std::lock_guard<std::mutex> lock(session->write_mu);
    if (session->stream != nullptr) session->stream->Cancel();
  }
}

void DevGateway::WithholdAcks(bool withhold) {
  std::map<std::string, uint64_t> highest;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->withhold_acks = withhold;
    if (withhold) return;
    for (const auto& [node, session] : state_->open) {
      for (const v1::AgentFrame& frame : state_->received[node]) {
        uint64_t seq = frame.has_event()            ? frame.event().seq()
                       : frame.has_command_update() ? frame.command_update().seq()
                                                    : 0;
        highest[node] = std::max(highest[node], seq);
      }
    }
  }
  // Acks resume with one covering everything received while they were withheld.
  for (const auto& [node, seq] : highest) {
    if (seq == 0) continue;
    v1::ServerFrame ack;
    ack.mutable_ack()->set_up_to_seq(seq);
    Push(node, ack);
  }
}

int DevGateway::renewals() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->renewals;
}

const std::string& DevTunnel::id() const { return impl_->id; }
const std::string& DevTunnel::ticket() const { return impl_->ticket; }

bool DevTunnel::WaitOpened(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(impl_->mu);
  return impl_->cv.wait_for(lock, timeout, [&] { return impl_->opened; });
}

bool DevTunnel::WaitEnded(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(impl_->mu);
  return impl_->cv.wait_for(lock, timeout, [&] { return impl_->ended; });
}

bool DevTunnel::Send(uint32_t channel, const std::string& bytes) {
  v1::TunnelFrame frame;
  frame.mutable_data()->set_channel(channel);
  frame.mutable_data()->set_data(bytes);
  return impl_->Write(frame);
}

bool DevTunnel::Resize(uint32_t rows, uint32_t cols) {
  v1::TunnelFrame frame;
  frame.mutable_resize()->set_rows(rows);
  frame.mutable_resize()->set_cols(cols);
  return impl_->Write(frame);
}

bool DevTunnel::Close() {
  v1::TunnelFrame frame;
  frame.mutable_closed()->set_reason("closed by the operator");
  return impl_->Write(frame);
}

void DevTunnel::Cancel() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->context != nullptr) impl_->context->TryCancel();
  impl_->ended = true;
  impl_->cv.notify_all();
}

std::optional<v1::TunnelFrame> DevTunnel::Next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(impl_->mu);
  if (!impl_->cv.wait_for(lock, timeout, [&] { return !impl_->queue.empty() || impl_->ended; }) ||
      impl_->queue.empty()) {
    return std::nullopt;
  }
  v1::TunnelFrame frame = impl_->queue.front();
  impl_->queue.pop_front();
  impl_->cv.notify_all();
  return frame;
}

DevTunnel::Outcome DevTunnel::Collect(std::chrono::milliseconds timeout) {
  Outcome outcome;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    std::optional<v1::TunnelFrame> frame =
        Next(std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now()));
    if (!frame) break;
    if (frame->has_data()) {
      (frame->data().channel() == 1 ? outcome.err : outcome.out) += frame->data().data();
    } else if (frame->has_closed()) {
      outcome.closed = true;
      outcome.exit_code = frame->closed().exit_code();
      outcome.reason = frame->closed().reason();
      break;
    }
  }
  return outcome;
}

std::string DevTunnel::ReadUntil(const std::string& text, std::chrono::milliseconds timeout) {
  std::string out;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (out.find(text) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    std::optional<v1::TunnelFrame> frame =
        Next(std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now()));
    if (!frame) break;
    if (frame->has_data()) out += frame->data().data();
  }
  return out;
}

std::string DevGateway::TunnelJwks() const {
  return pki::JwksOf(state_->access_key.Public(), "dev-access");
}

v1::AccessSection DevGateway::TunnelAccess(std::vector<std::string> ops) const {
  v1::AccessSection access;
  access.set_tunnel_jwks(TunnelJwks());
  for (const std::string& op : ops) access.add_allowed_ops(op);
  return access;
}

DevTunnel DevGateway::OpenTunnel(const std::string& node_id, const DevTunnelRequest& request) {
  auto impl = std::make_shared<DevTunnel::Impl>();
  impl->node = node_id;
  std::string sid;
  int64_t now;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    impl->id = "dev-tunnel-" + std::to_string(state_->next_tunnel++);
    sid = state_->session_ids[node_id];
    now = state_->Now();
    state_->tunnels[impl->id] = impl;
  }
  if (!request.ticket.empty()) {
    impl->ticket = request.ticket;
  } else {
    nlohmann::json claims = {
        {"aud", request.aud.empty() ? "node:" + node_id : request.aud},
        {"jti", request.jti.empty() ? pki::Base64UrlEncode(pki::RandomBytes(12)) : request.jti},
        {"iat", now + request.clock_offset},
        {"exp", now + request.clock_offset + 60},
        {"sid", request.sid.empty() ? sid : request.sid},
        {"tid", impl->id},
        {"op", request.op}};
    if (request.op == "exec") claims["cmd"] = request.cmd;
    if (request.op == "tcp") {
      claims["host"] = request.host;
      claims["port"] = request.port;
    }
    if (request.op == "instance-tcp") {
      claims["instance"] = request.instance;
      claims["port"] = request.port;
    }
    if (request.op == "shell" && request.rows != 0) {
      claims["rows"] = request.rows;
      claims["cols"] = request.cols;
    }
    pki::PrivateKey other = *pki::PrivateKey::Generate();
    impl->ticket =
        *pki::SignJwt(claims.dump(), request.foreign_key ? other : state_->access_key, request.kid);
  }
  v1::ServerFrame frame;
  frame.mutable_open_tunnel()->set_tunnel_id(impl->id);
  frame.mutable_open_tunnel()->set_ticket(impl->ticket);
  Push(node_id, frame);
  return DevTunnel(impl);
}

void DevGateway::Revoke(const std::string& node_id) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->revoked.insert(node_id);
}

int DevGateway::websocket_renewals() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  int total = 0;
  for (const auto& [node, times] : state_->ws_renewal_times)
    total += static_cast<int>(times.size());
  return total;
}

int DevGateway::clean_ends() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->clean_ends;
}

std::string DevGateway::AddProvisioningCredential(const std::string& node_id) {
  std::string credential = "bcdpc_" + pki::Base64UrlEncode(pki::RandomBytes(24));
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->credentials[node_id] = credential;
  return credential;
}

std::string DevGateway::AddJoinToken(const std::string& node_id, int64_t ttl, std::string token) {
  if (token.empty()) token = "bcdjt_" + pki::Base64UrlEncode(pki::RandomBytes(24));
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->tokens[token] = {node_id, state_->Now() + ttl, false, ""};
  return token;
}

void DevGateway::DeferJoins(int count, uint32_t retry_after) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->defer_count = count;
  state_->defer_seconds = retry_after;
}

int DevGateway::joins_granted() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->granted;
}

int DevGateway::join_calls() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->calls;
}

void DevGateway::AddSecret(const std::string& ref, const std::string& value,
                           SecretBinding binding) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->secrets[ref] = {value, std::move(binding)};
}

void DevGateway::RefuseSecrets(const std::string& error) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->secret_refusal = error;
}

void DevGateway::SetTenantControlled(const std::string& node_id, bool tenant) {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (tenant) {
    state_->tenant_nodes.insert(node_id);
  } else {
    state_->tenant_nodes.erase(node_id);
  }
}

void DevGateway::SetSecretFault(SecretFault fault) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->secret_fault = fault;
}

void DevGateway::DelaySecretAnswers(std::chrono::milliseconds delay) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->secret_delay = delay;
}

void DevGateway::VerifyNodeSigsWith(const pki::PublicKey& key) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->node_sig_key = key;
}

int DevGateway::bad_node_sigs() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->bad_node_sigs;
}

void DevGateway::AllowWorkloadTokens(const std::string& instance_id) {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->workload_instances.insert(instance_id);
}

bool DevGateway::PushStraySecretAnswer(const std::string& node_id) {
  v1::ServerFrame frame;
  frame.mutable_secret_response()->set_request_id("never-asked");
  frame.mutable_secret_response()->set_error("not-found");
  return Push(node_id, frame);
}

std::string DevConfigToml(int port, const DevPki& pki, const std::filesystem::path& state_dir) {
  return fmt::format(
      "gateway_url = \"https://127.0.0.1:{}\"\ngateway_server_name = \"{}\"\n"
      "gateway_ca_spki_sha256 = \"{}\"\nstate_dir = \"{}\"\n",
      port, DevPki::kGatewayName, pki.ServingCaPinHex(), state_dir.string());
}

std::string DevGateway::ConfigToml(const std::filesystem::path& state_dir) const {
  return DevConfigToml(port_, *state_->pki, state_dir);
}

}  // namespace bcd::testing
