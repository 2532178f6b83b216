#include "testing/dev_gateway.h"

#include <condition_variable>
#include <ctime>
#include <set>
#include <thread>

#include "bettercompute/agent/v1/session.grpc.pb.h"
#include "fmt/format.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "pki/base64url.h"
#include "pki/envelope.h"
#include "pki/jwe.h"
#include "pki/jwt.h"
#include "proto/absl_compat.h"
#include "proto/frame_codec.h"
#include "proto/signing_input.h"
#include "proto/version.h"
#include "transport/tls.h"

namespace bcd::testing {

namespace v1 = bettercompute::agent::v1;

struct JoinToken {
  std::string node_id;
  int64_t expires_at = 0;
  bool used = false;
  std::string deferred_csr;  // the CSR a deferral asked to see again
};

struct OpenSession {
  grpc::ServerContext* context;
  grpc::ServerReaderWriter<v1::ServerFrame, v1::AgentFrame>* stream;
  std::mutex write_mu;
};

struct DevGateway::State {
  const DevPki* pki;
  proto::ProtocolRange range = proto::kProtocolVersion;
  mutable std::condition_variable cv;
  std::map<std::string, v1::Hello> hellos;                      // guarded by mu
  std::map<std::string, std::vector<v1::AgentFrame>> received;  // guarded by mu
  std::map<std::string, std::shared_ptr<OpenSession>> open;     // guarded by mu
  std::vector<std::string> session_nodes;                       // guarded by mu
  int welcomes = 0;                                             // guarded by mu
  int clean_ends = 0;                                           // guarded by mu
  int refuse_count = 0;                                         // guarded by mu
  int refuse_code = 0;                                          // guarded by mu
  std::string refuse_reason;                                    // guarded by mu
  int64_t refuse_pushback_ms = 0;                               // guarded by mu
  int next_session = 1;                                         // guarded by mu
  bool withhold_acks = false;                                   // guarded by mu
  int renewals = 0;                                             // guarded by mu
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
  std::set<std::string> renew_nonces;  // guarded by mu
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
      v1::JoinGrant* grant = body.mutable_grant();
      grant->add_certificate_chain(leaf->Der());
      grant->add_certificate_chain(state_->pki->node_ca().Der());
      *grant->mutable_trust_bundle() = state_->pki->SignedBundle(1);
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
    absl::StatusOr<std::vector<pki::Certificate>> chain =
        pki::ParseDerChain({request->chain().begin(), request->chain().end()});
    if (!peer.ok() || !chain.ok() || chain->front().Der() != peer->Der()) {
      return Refuse(context, grpc::StatusCode::PERMISSION_DENIED, "chain-mismatch",
                    "the chain is not the caller's TLS identity");
    }
    std::lock_guard<std::mutex> lock(state_->mu);
    int64_t now = state_->Now();
    if (absl::Status s = pki::VerifyChain(*chain, {state_->pki->node_ca()}, now); !s.ok()) {
      return Refuse(context, grpc::StatusCode::PERMISSION_DENIED, "bad-chain",
                    std::string(ToStd(s.message())));
    }
    if (std::llabs(static_cast<long long>(request->timestamp()) - now) > 60) {
      return Refuse(context, grpc::StatusCode::PERMISSION_DENIED, "stale",
                    "the timestamp is not within 60 s");
    }
    if (request->nonce().size() != 16 || !state_->renew_nonces.insert(request->nonce()).second) {
      return Refuse(context, grpc::StatusCode::PERMISSION_DENIED, "replay",
                    "the nonce was seen before");
    }
    absl::StatusOr<pki::PublicKey> current = chain->front().Key();
    if (!current.ok() ||
        !current->VerifyEs256(proto::RenewSigningInput(*request), request->proof()).ok()) {
      return Refuse(context, grpc::StatusCode::PERMISSION_DENIED, "bad-proof",
                    "the proof does not verify");
    }
    absl::StatusOr<pki::PublicKey> key = pki::VerifyCsr(request->csr());
    absl::StatusOr<pki::NodeIdentity> identity = pki::IdentityOf(chain->front());
    if (!key.ok() || !identity.ok()) {
      return Refuse(context, grpc::StatusCode::INVALID_ARGUMENT, "bad-csr",
                    "the CSR or identity is malformed");
    }
    absl::StatusOr<pki::Certificate> leaf =
        state_->pki->IssueNode(*key, identity->id.node(), identity->generation.value_or(0) + 1, now,
                               state_->options.node_cert_lifetime);
    if (!leaf.ok())
      return grpc::Status(grpc::StatusCode::INTERNAL, std::string(ToStd(leaf.status().message())));
    response->add_certificate_chain(leaf->Der());
    response->add_certificate_chain(state_->pki->node_ca().Der());
    ++state_->renewals;
    state_->cv.notify_all();
    return grpc::Status::OK;
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
    std::string node = identity->id.node();
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (state_->refuse_count > 0) {
        --state_->refuse_count;
        if (state_->refuse_pushback_ms > 0) {
          context->AddTrailingMetadata("grpc-retry-pushback-ms",
                                       std::to_string(state_->refuse_pushback_ms));
        }
        return Refuse(context, static_cast<grpc::StatusCode>(state_->refuse_code),
                      state_->refuse_reason, "refused by the dev gateway");
      }
    }
    v1::AgentFrame first;
    if (!stream->Read(&first) || !first.has_hello()) {
      return Refuse(context, grpc::StatusCode::INVALID_ARGUMENT, "expected-hello",
                    "the first frame must be Hello");
    }
    absl::StatusOr<proto::ProtocolRange> daemon =
        proto::ProtocolRange::Make(first.hello().proto_min(), first.hello().proto_max());
    absl::StatusOr<proto::Negotiated> negotiated =
        daemon.ok() ? proto::Negotiate(state_->range, *daemon)
                    : absl::StatusOr<proto::Negotiated>(daemon.status());
    if (!negotiated.ok()) {
      return Refuse(context, grpc::StatusCode::FAILED_PRECONDITION, "protocol-version",
                    std::string(ToStd(negotiated.status().message())));
    }
    auto session = std::make_shared<OpenSession>();
    session->context = context;
    session->stream = stream;
    v1::ServerFrame welcome;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      welcome.mutable_welcome()->set_protocol_version(negotiated->protocol_version);
      welcome.mutable_welcome()->set_upgrade_required(negotiated->upgrade_required);
      welcome.mutable_welcome()->set_session_id("dev-session-" +
                                                std::to_string(state_->next_session++));
      welcome.mutable_welcome()->set_server_time(static_cast<uint64_t>(state_->Now()));
      state_->hellos[node] = first.hello();
      state_->received[node].clear();
      state_->open[node] = session;
      state_->session_nodes.push_back(node);
    }
    {
      std::lock_guard<std::mutex> lock(session->write_mu);
      stream->Write(welcome);
    }
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      ++state_->welcomes;
    }
    state_->cv.notify_all();
    v1::AgentFrame frame;
    while (stream->Read(&frame)) {
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
        std::optional<v1::ServerFrame> answer = AnswerSecret(node, *cert, frame);
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
          stream->Write(*answer);
        }
      }
      if (ack) {
        v1::ServerFrame reply;
        reply.mutable_ack()->set_up_to_seq(seq);
        std::lock_guard<std::mutex> lock(session->write_mu);
        stream->Write(reply);
      }
    }
    {
      std::lock_guard<std::mutex> lock(session->write_mu);
      session->stream =
          nullptr;  // a Push racing the end finds no stream rather than a dangling one
    }
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->open[node] == session) state_->open.erase(node);
    if (!context->IsCancelled()) ++state_->clean_ends;
    state_->cv.notify_all();
    return grpc::Status::OK;
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
  if (server_) {
    DropSessions();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
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
  std::shared_ptr<OpenSession> session;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    auto it = state_->open.find(node_id);
    if (it == state_->open.end()) return false;
    session = it->second;
  }
  std::lock_guard<std::mutex> lock(session->write_mu);
  return session->stream != nullptr && session->stream->Write(frame);
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
  std::lock_guard<std::mutex> lock(state_->mu);
  for (auto& [node, session] : state_->open) session->context->TryCancel();
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

std::string DevGateway::AddJoinToken(const std::string& node_id, int64_t ttl) {
  std::string token = "bcdjt_" + pki::Base64UrlEncode(pki::RandomBytes(24));
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
