#include "testing/dev_pki.h"

#include "pki/envelope.h"
#include "proto/signing_input.h"

namespace bcd::testing {

absl::StatusOr<DevPki> DevPki::Create(int64_t now) {
  DevPki pki;
  constexpr int64_t kYear = 365 * 86400;
  auto ca = [&](const char* cn, const pki::PrivateKey& key) {
    return pki::IssueCertificate(
        {.common_name = cn, .not_before = now - 3600, .not_after = now + kYear, .is_ca = true},
        key.Public(), key, nullptr);
  };
  absl::StatusOr<pki::Certificate> serving_ca = ca("bcd dev serving CA", pki.serving_ca_key_);
  if (!serving_ca.ok()) return serving_ca.status();
  pki.serving_ca_ = *serving_ca;
  absl::StatusOr<pki::Certificate> node_ca = ca("bcd dev node CA", pki.node_ca_key_);
  if (!node_ca.ok()) return node_ca.status();
  pki.node_ca_ = *node_ca;
  absl::StatusOr<pki::Certificate> signing_root =
      ca("bcd dev command-signing root", pki.signing_root_key_);
  if (!signing_root.ok()) return signing_root.status();
  pki.signing_root_ = *signing_root;
  absl::StatusOr<pki::Certificate> worker = pki::IssueCertificate(
      {.common_name = "dev worker", .not_before = now - 3600, .not_after = now + kYear},
      pki.worker_key_.Public(), pki.signing_root_key_, &*pki.signing_root_);
  if (!worker.ok()) return worker.status();
  pki.worker_ = *worker;
  absl::StatusOr<pki::Certificate> leaf =
      pki::IssueCertificate({.common_name = kGatewayName,
                             .dns_sans = {kGatewayName, "localhost"},
                             .ip_sans = {"127.0.0.1", "::1"},
                             .not_before = now - 3600,
                             .not_after = now + kYear,
                             .server_auth = true},
                            pki.serving_key_.Public(), pki.serving_ca_key_, &*pki.serving_ca_);
  if (!leaf.ok()) return leaf.status();
  pki.serving_leaf_ = *leaf;
  return pki;
}

absl::StatusOr<pki::Certificate> DevPki::IssueNode(const pki::PublicKey& subject,
                                                   const std::string& node_id, uint64_t generation,
                                                   int64_t now, int64_t lifetime) const {
  return pki::IssueCertificate(
      {.common_name = node_id,
       .uri_sans = {std::string("spiffe://") + kTrustDomain + "/site/" + kSite + "/node/" + node_id,
                    "urn:bc:generation:" + std::to_string(generation)},
       .not_before =
           now - std::min<int64_t>(60, lifetime / 10),  // some clock slack, small for short lives
       .not_after = now + lifetime,
       .client_auth = true},
      subject, node_ca_key_, &*node_ca_);
}

bettercompute::common::v1::Signature DevPki::WorkerSignature(proto::Purpose purpose,
                                                             const std::string& body) const {
  return *pki::Sign(proto::BodySigningInput(purpose, body), worker_key_, "dev-worker",
                    {worker_->Der()});
}

bettercompute::agent::v1::SignedCommand DevPki::SignCommand(
    const bettercompute::agent::v1::Command& command, bool sign) const {
  bettercompute::agent::v1::SignedCommand out;
  out.set_body(command.SerializeAsString());
  if (sign) *out.mutable_signature() = WorkerSignature(proto::Purpose::kCommand, out.body());
  return out;
}

bettercompute::agent::v1::SignedSpec DevPki::SignSpec(
    const bettercompute::agent::v1::NodeSpec& spec, bool sign) const {
  bettercompute::agent::v1::SignedSpec out;
  out.set_body(spec.SerializeAsString());
  if (sign) *out.mutable_signature() = WorkerSignature(proto::Purpose::kSpec, out.body());
  return out;
}

bettercompute::agent::v1::Command DevPki::MakeCommand(const std::string& id,
                                                      const std::string& node_id,
                                                      const std::string& kind, int64_t now,
                                                      int64_t ttl) {
  bettercompute::agent::v1::Command command;
  command.set_command_id(id);
  command.set_node_id(node_id);
  command.set_kind(kind);
  command.set_issued_at(static_cast<uint64_t>(now));
  command.set_expires_at(static_cast<uint64_t>(now + ttl));
  return command;
}

bettercompute::agent::v1::SignedTrustBundle DevPki::SignedBundle(uint64_t version,
                                                                 bool command_signing) const {
  bettercompute::agent::v1::TrustBundle bundle;
  bundle.set_trust_domain(kTrustDomain);
  bundle.set_version(version);
  bundle.add_node_ca(node_ca_->Der());
  if (command_signing) bundle.add_command_signing_roots(signing_root_->Der());
  bettercompute::agent::v1::SignedTrustBundle signed_bundle;
  signed_bundle.set_body(bundle.SerializeAsString());
  *signed_bundle.mutable_signature() =
      *pki::Sign(proto::BodySigningInput(proto::Purpose::kTrustBundle, signed_bundle.body()),
                 join_key_, "join");
  return signed_bundle;
}

}  // namespace bcd::testing

namespace bcd::testing {

bettercompute::agent::v1::SignedTrustBundle DevPki::SignedBundleWithApprovers(
    uint64_t version, const std::vector<pki::PrivateKey>& approvers, uint32_t threshold,
    uint64_t epoch, uint32_t unbatched_per_hour,
    const std::vector<std::pair<uint32_t, uint32_t>>& tiers) const {
  bettercompute::agent::v1::TrustBundle bundle;
  bundle.ParseFromString(SignedBundle(version).body());
  for (std::size_t i = 0; i < approvers.size(); ++i) {
    auto* key = bundle.add_approver_keys();
    key->set_kid("a" + std::to_string(i));
    key->set_spki(approvers[i].Public().SpkiDer());
  }
  bundle.set_approver_threshold(threshold);
  bundle.set_approver_set_epoch(epoch);
  bundle.set_unbatched_destructive_per_hour(unbatched_per_hour);
  for (const auto& [min_targets, tier_threshold] : tiers) {
    auto* tier = bundle.add_quorum_tiers();
    tier->set_min_targets(min_targets);
    tier->set_threshold(tier_threshold);
  }
  bettercompute::agent::v1::SignedTrustBundle signed_bundle;
  signed_bundle.set_body(bundle.SerializeAsString());
  *signed_bundle.mutable_signature() =
      *pki::Sign(proto::BodySigningInput(proto::Purpose::kTrustBundle, signed_bundle.body()),
                 join_key_, "join");
  return signed_bundle;
}

void DevPki::Approve(bettercompute::agent::v1::SignedCommand* command,
                     const std::vector<pki::PrivateKey>& approvers, const std::vector<int>& which) {
  std::string digest =
      pki::Sha256(command->batch_manifest().empty() ? command->body() : command->batch_manifest());
  for (int i : which) {
    *command->add_approvals() =
        *pki::Sign(proto::ApproveSigningInput(digest), approvers[static_cast<std::size_t>(i)],
                   "a" + std::to_string(i));
  }
}

std::string DevPki::Manifest(const std::string& batch_id, const std::string& kind,
                             const std::vector<std::pair<std::string, std::string>>& targets) {
  bettercompute::agent::v1::BatchManifest manifest;
  manifest.set_batch_id(batch_id);
  manifest.set_kind(kind);
  for (const auto& [node, command] : targets) {
    auto* target = manifest.add_targets();
    target->set_node_id(node);
    target->set_command_id(command);
  }
  return manifest.SerializeAsString();
}

bettercompute::agent::v1::DaemonUpgradePayload DevPki::SignRelease(const pki::PrivateKey& key,
                                                                   const std::string& version,
                                                                   const std::string& os_arch,
                                                                   std::string_view binary,
                                                                   const std::string& url) {
  bettercompute::agent::v1::DaemonUpgradePayload payload;
  std::string sha256 = pki::Sha256(binary);
  payload.set_version(version);
  payload.set_url(url);
  payload.set_sha256(sha256);
  payload.set_signature(*key.SignEs256(proto::ReleaseSigningInput(version, os_arch, sha256)));
  payload.set_release_key_spki(key.Public().SpkiDer());
  payload.set_release_key(pki::Hex(key.Public().SpkiSha256()));
  return payload;
}

}  // namespace bcd::testing
