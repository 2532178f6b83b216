#include "testing/dev_gateway.h"

#include <ctime>

#include "bettercompute/agent/v1/session.grpc.pb.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "pki/base64url.h"
#include "pki/envelope.h"
#include "proto/absl_compat.h"
#include "proto/frame_codec.h"
#include "proto/signing_input.h"
#include "transport/tls.h"

namespace bcd::testing {

namespace v1 = bettercompute::agent::v1;

struct JoinToken {
  std::string node_id;
  int64_t expires_at = 0;
  bool used = false;
  std::string deferred_csr;  // the CSR a deferral asked to see again
};

struct DevGateway::State {
  const DevPki* pki;
  DevGatewayOptions options;
  mutable std::mutex mu;
  std::map<std::string, JoinToken> tokens;  // guarded by mu
  int defer_count = 0;                      // guarded by mu
  uint32_t defer_seconds = 0;               // guarded by mu
  int granted = 0;                          // guarded by mu
  int calls = 0;                            // guarded by mu

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
    if (request->attestor() != "join-token") {
      return Refuse(context, grpc::StatusCode::INVALID_ARGUMENT, "unsupported-attestor",
                    "the dev gateway knows the join-token attestor only");
    }
    if (request->role() != bettercompute::common::v1::ROLE_NODE &&
        request->role() != bettercompute::common::v1::ROLE_SITE) {
      return Refuse(context, grpc::StatusCode::INVALID_ARGUMENT, "bad-role",
                    "role must be node or site");
    }
    auto it = state_->tokens.find(request->evidence());
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

 private:
  std::shared_ptr<DevGateway::State> state_;
};

absl::StatusOr<std::unique_ptr<DevGateway>> DevGateway::Start(const DevPki& pki,
                                                              DevGatewayOptions options) {
  if (absl::Status s = transport::RequireTls13(); !s.ok()) return s;
  std::unique_ptr<DevGateway> gateway(new DevGateway());
  gateway->state_ = std::make_shared<State>();
  gateway->state_->pki = &pki;
  gateway->state_->options = options;
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
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
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

}  // namespace bcd::testing
