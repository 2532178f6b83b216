#include "testing/gateway_state.h"

// Sessions on either transport (Hello, Welcome, frames), tunnels, and the secret broker.

#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "pki/base64url.h"
#include "pki/envelope.h"
#include "pki/jwe.h"
#include "pki/jwt.h"
#include "proto/absl_compat.h"
#include "proto/frame_codec.h"
#include "proto/signing_input.h"
#include "transport/tls.h"
#include "transport/ws_auth.h"

namespace bcd::testing {

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

grpc::Status AgentGatewayService::Session(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::ServerFrame, v1::AgentFrame>* stream) {
  // The node id comes from the client certificate's SPIFFE SAN, never from a frame.
  std::vector<grpc::string_ref> pems = context->auth_context()->FindPropertyValues("x509_pem_cert");
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

grpc::Status AgentGatewayService::Tunnel(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::TunnelFrame, v1::TunnelFrame>* stream) {
  std::vector<grpc::string_ref> pems = context->auth_context()->FindPropertyValues("x509_pem_cert");
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

std::optional<Outcome> AgentGatewayService::TakeRefusal(const std::string& node) {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->revoked.contains(node)) {
    return Outcome{grpc::StatusCode::PERMISSION_DENIED, "revoked", "this node is revoked"};
  }
  if (state_->refuse_count <= 0) return std::nullopt;
  --state_->refuse_count;
  return Outcome{static_cast<grpc::StatusCode>(state_->refuse_code), state_->refuse_reason,
                 "refused by the dev gateway", state_->refuse_pushback_ms};
}

Outcome AgentGatewayService::RunSession(GatewayStream& stream, const std::string& node,
                                        const pki::Certificate& cert,
                                        const std::string& transport_name) {
  v1::AgentFrame first;
  if (!stream.Read(&first) || !first.has_hello()) {
    return {grpc::StatusCode::INVALID_ARGUMENT, "expected-hello", "the first frame must be Hello"};
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
    session->stream = nullptr;  // a Push racing the end finds no stream rather than a dangling one
  }
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->open[node] == session) state_->open.erase(node);
  if (!stream.broken()) ++state_->clean_ends;
  state_->cv.notify_all();
  return {};
}

std::optional<v1::ServerFrame> AgentGatewayService::AnswerSecret(const std::string& node,
                                                                 const pki::Certificate& cert,
                                                                 const v1::AgentFrame& frame) {
  bool workload = frame.has_workload_token_request();
  const v1::SecretRequest& secret = frame.secret_request();
  const v1::WorkloadTokenRequest& token = frame.workload_token_request();
  std::string input =
      workload ? proto::WorkloadTokenSigningInput(token) : proto::SecretRequestSigningInput(secret);
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
      std::string claims = fmt::format(R"({{"iss":"dev","sub":"{}","aud":"{}","iat":{},"exp":{}}})",
                                       token.instance_id(),
                                       token.audience().empty() ? "dev-default" : token.audience(),
                                       state_->Now(), state_->Now() + 600);
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

}  // namespace bcd::testing
