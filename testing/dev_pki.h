#pragma once

// The dev stack's PKI: a serving CA and gateway certificate, a node CA, the JoinService key, a
// command-signing root and worker key. Fresh keys every time; nothing here is for production.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bettercompute/agent/v1/commands.pb.h"
#include "bettercompute/agent/v1/spec.pb.h"
#include "bettercompute/agent/v1/trust.pb.h"
#include "pki/issue.h"
#include "pki/keys.h"
#include "pki/x509.h"
#include "proto/signing_input.h"

namespace bcd::testing {

class DevPki {
 public:
  static constexpr char kTrustDomain[] = "dev.test";
  static constexpr char kSite[] = "dev";
  static constexpr char kGatewayName[] = "gw.dev.test";

  // Names the gateway certificate carries besides kGatewayName: "localhost", 127.0.0.1 and ::1.
  static absl::StatusOr<DevPki> Create(int64_t now);

  const pki::PrivateKey& serving_key() const { return serving_key_; }
  const pki::Certificate& serving_ca() const { return *serving_ca_; }
  const pki::Certificate& serving_leaf() const { return *serving_leaf_; }
  // Leaf then serving CA, as the gateway presents them.
  std::string ServingChainPem() const { return serving_leaf_->Pem() + serving_ca_->Pem(); }
  // What bcd pins: sha256 of the serving CA's SPKI, hex.
  std::string ServingCaPinHex() const { return pki::Hex(serving_ca_->SpkiSha256()); }

  const pki::Certificate& node_ca() const { return *node_ca_; }
  const pki::PrivateKey& join_service_key() const { return join_key_; }

  // A node certificate for `subject` with its SPIFFE id and generation, living `lifetime` seconds.
  absl::StatusOr<pki::Certificate> IssueNode(const pki::PublicKey& subject,
                                             const std::string& node_id, uint64_t generation,
                                             int64_t now, int64_t lifetime) const;

  // A command `id` of `kind` for `node_id`, issued at `now` and expiring `ttl` seconds later.
  static bettercompute::agent::v1::Command MakeCommand(const std::string& id,
                                                       const std::string& node_id,
                                                       const std::string& kind, int64_t now,
                                                       int64_t ttl = 300);
  // A command for `node_id`, signed by the worker key with its chain (or unsigned).
  bettercompute::agent::v1::SignedCommand SignCommand(
      const bettercompute::agent::v1::Command& command, bool sign = true) const;
  // A desired state, signed like a command (purpose "spec"), or unsigned.
  bettercompute::agent::v1::SignedSpec SignSpec(const bettercompute::agent::v1::NodeSpec& spec,
                                                bool sign = true) const;
  const pki::PrivateKey& worker_key() const { return worker_key_; }
  const pki::Certificate& signing_root() const { return *signing_root_; }

  // The trust bundle of this PKI at `version`, signed by the JoinService key; with the
  // command-signing root, so command signing is on (unless `command_signing` is false).
  bettercompute::agent::v1::SignedTrustBundle SignedBundle(uint64_t version,
                                                           bool command_signing = true) const;
  // The same bundle with an approver set: `approvers` as kids a0, a1, ... at `epoch`, with
  // quorum tiers as (min_targets, threshold).
  bettercompute::agent::v1::SignedTrustBundle SignedBundleWithApprovers(
      uint64_t version, const std::vector<pki::PrivateKey>& approvers, uint32_t threshold,
      uint64_t epoch, uint32_t unbatched_per_hour = 0,
      const std::vector<std::pair<uint32_t, uint32_t>>& tiers = {}) const;

  // A daemon.upgrade payload for the release `binary` (its bytes) at `url`, signed by `key` for
  // `os_arch` (wire.md "Releases"), with the key's SPKI and its pin.
  static bettercompute::agent::v1::DaemonUpgradePayload SignRelease(const pki::PrivateKey& key,
                                                                    const std::string& version,
                                                                    const std::string& os_arch,
                                                                    std::string_view binary,
                                                                    const std::string& url);

  // Adds the approval of `approvers[i]` (kid "a<i>") for each i in `which`: over sha256 of the
  // batch manifest when the command carries one, else over sha256 of its body.
  static void Approve(bettercompute::agent::v1::SignedCommand* command,
                      const std::vector<pki::PrivateKey>& approvers, const std::vector<int>& which);
  // The bytes of a batch manifest for `targets` as (node_id, command_id).
  static std::string Manifest(const std::string& batch_id, const std::string& kind,
                              const std::vector<std::pair<std::string, std::string>>& targets);

 private:
  DevPki() = default;
  // The worker key's signature over `body` for `purpose`, carrying the worker's certificate.
  bettercompute::common::v1::Signature WorkerSignature(proto::Purpose purpose,
                                                       const std::string& body) const;
  pki::PrivateKey serving_ca_key_ = *pki::PrivateKey::Generate();
  pki::PrivateKey serving_key_ = *pki::PrivateKey::Generate();
  pki::PrivateKey node_ca_key_ = *pki::PrivateKey::Generate();
  pki::PrivateKey join_key_ = *pki::PrivateKey::Generate();
  pki::PrivateKey signing_root_key_ = *pki::PrivateKey::Generate();
  pki::PrivateKey worker_key_ = *pki::PrivateKey::Generate();
  std::optional<pki::Certificate> serving_ca_, serving_leaf_, node_ca_, signing_root_, worker_;
};

}  // namespace bcd::testing
