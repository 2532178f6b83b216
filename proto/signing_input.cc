#include "proto/signing_input.h"

#include <cstdlib>
#include <limits>

namespace bcd::proto {
namespace {

constexpr std::string_view kPrefix = "bettercompute.v1/";

void AppendPart(std::string* out, std::string_view part) {
  if (part.size() > std::numeric_limits<uint32_t>::max()) std::abort();
  out->append(Uint32Be(static_cast<uint32_t>(part.size())));
  out->append(part);
}

}  // namespace

std::string_view PurposeName(Purpose purpose) {
  switch (purpose) {
    case Purpose::kJoinResponse:
      return "join-response";
    case Purpose::kTrustBundle:
      return "trust-bundle";
    case Purpose::kApproverSet:
      return "approver-set";
    case Purpose::kCommand:
      return "command";
    case Purpose::kApprove:
      return "approve";
    case Purpose::kSpec:
      return "spec";
    case Purpose::kSecretRequest:
      return "secret-request";
    case Purpose::kWorkloadToken:
      return "workload-token";
    case Purpose::kRenew:
      return "renew";
    case Purpose::kWsSession:
      return "ws-session";
    case Purpose::kGatewayProof:
      return "gateway-proof";
    case Purpose::kDiscovery:
      return "discovery";
    case Purpose::kRelease:
      return "release";
  }
  std::abort();
}

std::string Uint32Be(uint32_t value) {
  std::string out(4, '\0');
  for (int i = 3; i >= 0; --i, value >>= 8) out[i] = static_cast<char>(value & 0xff);
  return out;
}

std::string Uint64Be(uint64_t value) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i, value >>= 8) out[i] = static_cast<char>(value & 0xff);
  return out;
}

std::string SigningInput(Purpose purpose, std::initializer_list<std::string_view> parts) {
  std::string_view name = PurposeName(purpose);
  std::size_t size = kPrefix.size() + name.size() + 1;
  for (std::string_view part : parts) size += 4 + part.size();
  std::string out;
  out.reserve(size);
  out.append(kPrefix);
  out.append(name);
  out.push_back('\0');
  for (std::string_view part : parts) AppendPart(&out, part);
  return out;
}

std::string BodySigningInput(Purpose purpose, std::string_view body) {
  return SigningInput(purpose, {body});
}

std::string ApproverSetSigningInput(uint64_t approver_set_epoch,
                                    std::string_view approver_set_sha256,
                                    std::string_view trust_domain) {
  return SigningInput(Purpose::kApproverSet,
                      {Uint64Be(approver_set_epoch), approver_set_sha256, trust_domain});
}

std::string ApproveSigningInput(std::string_view sha256_of_body_or_manifest) {
  return SigningInput(Purpose::kApprove, {sha256_of_body_or_manifest});
}

std::string SecretRequestSigningInput(const bettercompute::agent::v1::SecretRequest& request) {
  return SigningInput(Purpose::kSecretRequest,
                      {request.ref(), request.workflow_id(), request.step_id(),
                       request.allocation_id(), request.epk(), request.request_id()});
}

std::string WorkloadTokenSigningInput(
    const bettercompute::agent::v1::WorkloadTokenRequest& request) {
  return SigningInput(Purpose::kWorkloadToken, {request.request_id(), request.instance_id(),
                                                request.audience(), request.epk()});
}

std::string RenewSigningInput(const bettercompute::agent::v1::RenewRequest& request) {
  std::string_view leaf = request.chain().empty() ? std::string_view() : request.chain(0);
  return SigningInput(Purpose::kRenew,
                      {request.csr(), Uint64Be(request.timestamp()), request.nonce(), leaf});
}

std::string WsSessionSigningInput(std::string_view nonce, uint64_t time, std::string_view leaf_der,
                                  std::string_view host) {
  return SigningInput(Purpose::kWsSession, {nonce, Uint64Be(time), leaf_der, host});
}

std::string ReleaseSigningInput(std::string_view version, std::string_view os_arch,
                                std::string_view sha256) {
  return SigningInput(Purpose::kRelease, {version, os_arch, sha256});
}

std::string ApproverSetInput(const bettercompute::agent::v1::TrustBundle& bundle) {
  std::string out;
  AppendPart(&out, Uint32Be(static_cast<uint32_t>(bundle.approver_keys_size())));
  for (const auto& key : bundle.approver_keys()) AppendPart(&out, key.spki());
  AppendPart(&out, Uint32Be(bundle.approver_threshold()));
  AppendPart(&out, Uint32Be(static_cast<uint32_t>(bundle.quorum_tiers_size())));
  for (const auto& tier : bundle.quorum_tiers()) {
    AppendPart(&out, Uint32Be(tier.min_targets()) + Uint32Be(tier.threshold()));
  }
  AppendPart(&out, Uint32Be(bundle.unbatched_destructive_per_hour()));
  return out;
}

}  // namespace bcd::proto
