#include "daemon/identity/join.h"

#include "base/version.h"
#include "bettercompute/agent/v1/session.pb.h"
#include "daemon/identity/gateway.h"
#include "fmt/format.h"
#include "fmt/ostream.h"
#include "pki/envelope.h"
#include "pki/trust.h"
#include "proto/absl_compat.h"
#include "proto/frame_codec.h"
#include "proto/signing_input.h"
#include "transport/grpc_transport.h"
#include "transport/tls.h"

namespace bcd {
namespace {

namespace v1 = bettercompute::agent::v1;

void Say(const JoinSpec& spec, const std::string& line) {
  if (spec.progress) fmt::print(*spec.progress, "{}\n", line);
}

absl::Status Bad(std::string message) {
  return absl::UnauthenticatedError("join answer refused: " + message);
}

// Verifies a grant and turns it into the identity to store.
absl::StatusOr<Identity> Accept(const Config& config, const JoinSpec& spec,
                                const v1::JoinResponse& response, const v1::JoinGrant& grant,
                                pki::PrivateKey key) {
  absl::StatusOr<pki::PublicKey> join_key = pki::PublicKey::FromSpkiDer(grant.join_service_key());
  if (!join_key.ok())
    return Bad(fmt::format("JoinService key: {}", ToStd(join_key.status().message())));
  if (config.join_service_key_sha256() &&
      join_key->SpkiSha256() != std::string(config.join_service_key_sha256()->bytes().begin(),
                                            config.join_service_key_sha256()->bytes().end())) {
    return Bad(fmt::format("the JoinService key (SPKI sha256 {}) is not the pinned one ({})",
                           pki::Hex(join_key->SpkiSha256()),
                           config.join_service_key_sha256()->Hex()));
  }
  std::string input = proto::BodySigningInput(proto::Purpose::kJoinResponse, response.body());
  if (absl::Status s = pki::VerifyWithKey(input, response.signature(), *join_key); !s.ok()) {
    return Bad(fmt::format("signature: {}", ToStd(s.message())));
  }
  absl::StatusOr<pki::TrustState> trust =
      pki::TrustState::FromFirstBundle(grant.trust_bundle(), *join_key);
  if (!trust.ok()) return Bad(std::string(ToStd(trust.status().message())));
  absl::StatusOr<std::vector<pki::Certificate>> chain =
      pki::ParseDerChain({grant.certificate_chain().begin(), grant.certificate_chain().end()});
  if (!chain.ok()) return Bad(std::string(ToStd(chain.status().message())));
  if (chain->front().SpkiDer() != key.Public().SpkiDer())
    return Bad("the certificate is not for this node's key");
  if (absl::Status s = pki::VerifyChain(*chain, trust->node_cas(), spec.now()); !s.ok()) {
    return Bad(fmt::format("the certificate does not chain to the bundle's node CA: {}",
                           ToStd(s.message())));
  }
  absl::StatusOr<pki::NodeIdentity> node = pki::IdentityOf(chain->front());
  if (!node.ok()) return Bad(std::string(ToStd(node.status().message())));
  if (node->id.trust_domain() != trust->trust_domain()) {
    return Bad(fmt::format("the certificate is for trust domain {}, the bundle for {}",
                           node->id.trust_domain(), trust->trust_domain()));
  }
  if (!grant.node_id().empty() && grant.node_id() != node->id.node()) {
    return Bad(fmt::format("the grant says node {}, the certificate {}", grant.node_id(),
                           node->id.node()));
  }
  return Identity{std::move(key), *std::move(chain), *std::move(node), *std::move(join_key),
                  grant.trust_bundle()};
}

}  // namespace

absl::StatusOr<Identity> JoinFleet(const Config& config, const JoinSpec& spec) {
  if (!config.gateway_url() || !config.gateway_ca_spki_sha256()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: joining needs gateway_url and gateway_ca_spki_sha256", config.source()));
  }
  absl::StatusOr<StateDir> state = StateDir::Open(config.state_dir());
  if (!state.ok()) return state.status();
  absl::StatusOr<StateDirLock> lock = state->Lock();
  if (!lock.ok()) return lock.status();
  if (state->HasIdentity()) {
    return absl::FailedPreconditionError(
        fmt::format("this node has already joined (identity in {}); remove it to join again",
                    state->path().string()));
  }
  if (absl::Status s = transport::RequireTls13(); !s.ok()) return s;
  absl::StatusOr<pki::PrivateKey> key = pki::PrivateKey::Generate();
  if (!key.ok()) return key.status();
  absl::StatusOr<std::string> csr =
      pki::CreateCsr(*key, spec.node_id.empty() ? "bcd" : spec.node_id);
  if (!csr.ok()) return csr.status();

  // Join has no WebSocket form: a node behind a certificate-stripping proxy joins over gRPC first.
  transport::GrpcTransport gateway(GatewayChannel(config, spec.now), nullptr);

  v1::JoinRequest request;
  request.set_attestor(spec.attestor);
  request.set_evidence(spec.evidence);
  request.set_csr(*csr);
  *request.mutable_claims() = spec.claims;
  request.set_daemon_version(std::string(Version()));
  request.set_role(spec.role);
  request.set_node_id(spec.node_id);
  Say(spec, fmt::format("joining {} as {}", config.gateway_url()->text(),
                        bettercompute::common::v1::Role_Name(spec.role)));
  for (int deferrals = 0;; ++deferrals) {
    absl::StatusOr<v1::JoinResponse> response = gateway.Join(request, nullptr);
    if (!response.ok()) return response.status();
    v1::JoinResponseBody body;
    if (absl::Status s = proto::DecodeMessage(response->body(), &body); !s.ok()) {
      return Bad(std::string(ToStd(s.message())));
    }
    if (body.has_grant()) {
      absl::StatusOr<Identity> identity = Accept(config, spec, *response, body.grant(), *key);
      if (!identity.ok()) return identity.status();
      if (absl::Status s = state->SaveIdentity(*identity); !s.ok()) return s;
      Say(spec, fmt::format("joined as {}; identity stored in {}", identity->node.id.ToString(),
                            state->path().string()));
      return identity;
    }
    if (!body.has_deferral()) return Bad("neither a grant nor a deferral");
    if (deferrals + 1 >= kMaxDeferrals) {
      return absl::DeadlineExceededError(
          fmt::format("join deferred {} times; giving up", kMaxDeferrals));
    }
    auto delay =
        std::chrono::seconds(std::clamp<uint32_t>(body.deferral().retry_after_seconds(), 1, 3600));
    Say(spec, fmt::format("join deferred ({}); retrying in {} s with the same CSR",
                          body.deferral().reason(), delay.count()));
    spec.sleep(delay);
  }
}

}  // namespace bcd
