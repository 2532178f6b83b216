#include "testing/gateway_state.h"

// The WebSocket origin: the upgrade with its node and gateway proofs, POST /v1/renew, faults.

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

void AgentGatewayService::ServeWebSocket(WsExchange& exchange) {
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

}  // namespace bcd::testing
