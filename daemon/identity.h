#pragma once

// The node's identity in the state directory (0700): its key (0600), certificate chain, the pinned
// JoinService key and the signed trust bundle. Every file is written atomically; a missing or
// corrupt file is reported with its path and never replaced by an empty one.

#include <filesystem>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "bettercompute/agent/v1/trust.pb.h"
#include "pki/keys.h"
#include "pki/x509.h"

namespace bcd {

struct Identity {
  pki::PrivateKey key;
  std::vector<pki::Certificate> chain;  // leaf first
  pki::NodeIdentity node;
  pki::PublicKey join_service_key;
  bettercompute::agent::v1::SignedTrustBundle trust_bundle;
};

class StateDir {
 public:
  // Creates the directory 0700 when missing; refuses one that group or others can access.
  static absl::StatusOr<StateDir> Open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  bool HasIdentity() const;
  absl::Status SaveIdentity(const Identity& identity) const;
  absl::StatusOr<Identity> LoadIdentity() const;

  // Saves a renewed key and chain (and a newer trust bundle, if any) in one atomic rename.
  absl::Status SaveRenewed(const pki::PrivateKey& key,
                           const std::vector<pki::Certificate>& chain) const;

  // The key and its chain live in one file (0600), so a renewal switches both in one rename.
  std::filesystem::path IdentityPath() const { return path_ / "identity.pem"; }
  std::filesystem::path JoinServiceKeyPath() const { return path_ / "join-service.spki"; }
  std::filesystem::path TrustBundlePath() const { return path_ / "trust-bundle.binpb"; }

 private:
  explicit StateDir(std::filesystem::path path) : path_(std::move(path)) {}
  std::filesystem::path path_;
};

// What the state dir says of this node, as "key: value" lines (node, certificate expiry, trust
// version, approver set); a line says so when a part is missing or corrupt.
std::string StateDirStatusText(const std::filesystem::path& state_dir, int64_t now);

}  // namespace bcd
