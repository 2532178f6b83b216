#include "testing/gateway_state.h"

// Join and Renew: tokens and provisioning credentials, deferrals, the node CA issuing, renewal
// proofs, generations and revocation.

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

grpc::Status AgentGatewayService::Join(grpc::ServerContext* context, const v1::JoinRequest* request,
                                       v1::JoinResponse* response) {
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
      return grpc::Status(grpc::StatusCode::INTERNAL, std::string(ToStd(leaf.status().message())));
    token.used = true;
    ++state_->granted;
    state_->generations[token.node_id] = 1;
    v1::JoinGrant* grant = body.mutable_grant();
    grant->add_certificate_chain(leaf->Der());
    grant->add_certificate_chain(state_->pki->node_ca().Der());
    *grant->mutable_trust_bundle() = state_->pki->SignedBundle(1, state_->options.command_signing);
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

grpc::Status AgentGatewayService::Renew(grpc::ServerContext* context,
                                        const v1::RenewRequest* request,
                                        v1::RenewResponse* response) {
  std::vector<grpc::string_ref> pems = context->auth_context()->FindPropertyValues("x509_pem_cert");
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

Outcome AgentGatewayService::RenewChecked(const v1::RenewRequest& request,
                                          v1::RenewResponse* response, bool rate_limited) {
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
    return refuse(grpc::StatusCode::PERMISSION_DENIED, "stale", "the timestamp is not within 60 s");
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

}  // namespace bcd::testing
