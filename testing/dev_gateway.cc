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
#include "testing/gateway_state.h"
#include "testing/ws_server.h"
#include "transport/tls.h"
#include "transport/websocket.h"
#include "transport/ws_auth.h"

namespace bcd::testing {

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
