#pragma once

// The node's identity in the state directory (0700): its key (0600), certificate chain, the pinned
// JoinService key and the signed trust bundle. Every file is written atomically; a missing or
// corrupt file is reported with its path and never replaced by an empty one.

#include <filesystem>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "bettercompute/agent/v1/trust.pb.h"
#include "nlohmann/json_fwd.hpp"
#include "pki/keys.h"
#include "pki/trust.h"
#include "pki/x509.h"

namespace bcd {

struct Identity {
  pki::PrivateKey key;
  std::vector<pki::Certificate> chain;  // leaf first
  pki::NodeIdentity node;
  pki::PublicKey join_service_key;
  bettercompute::agent::v1::SignedTrustBundle trust_bundle;
  // The bundle the held approver set came from, when a later bundle's set was refused.
  std::optional<bettercompute::agent::v1::SignedTrustBundle> approver_source;
};

// The trust this identity enforces (pki::TrustState::Restore).
absl::StatusOr<pki::TrustState> TrustOf(const Identity& identity);

// The exclusive lock one daemon (or join) holds on a state directory (flock on
// <state_dir>/bcd.lock) for as long as it lives. Released when destroyed, or when the process ends.
class StateDirLock {
 public:
  StateDirLock(StateDirLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  StateDirLock& operator=(StateDirLock&&) = delete;
  ~StateDirLock();

 private:
  friend class StateDir;
  explicit StateDirLock(int fd) : fd_(fd) {}
  int fd_;
};

class StateDir {
 public:
  // Creates the directory 0700 when missing (its parents as usual). An existing one is checked,
  // never changed: it must be a directory owned by this user, with no access for group or
  // others; anything else is refused with the fix in the message.
  static absl::StatusOr<StateDir> Open(const std::filesystem::path& path);

  // Takes the exclusive lock, before anything else in the directory is opened; FailedPrecondition
  // naming the directory when another bcd holds it.
  absl::StatusOr<StateDirLock> Lock() const;

  const std::filesystem::path& path() const { return path_; }
  bool HasIdentity() const;
  absl::Status SaveIdentity(const Identity& identity) const;
  absl::StatusOr<Identity> LoadIdentity() const;

  // Saves a renewed key and chain (and a newer trust bundle, if any) in one atomic rename.
  absl::Status SaveRenewed(const pki::PrivateKey& key,
                           const std::vector<pki::Certificate>& chain) const;
  // Persists what `trust` enforces: its bundle, and the bundle of its approver set when that is an
  // earlier one. The held set's bundle is written before the newer bundle, so a crash between the
  // two never leaves a refused approver set to be taken at the next start.
  absl::Status SaveTrust(const pki::TrustState& trust) const;

  // The key and its chain live in one file (0600), so a renewal switches both in one rename.
  std::filesystem::path IdentityPath() const { return path_ / "identity.pem"; }
  std::filesystem::path JoinServiceKeyPath() const { return path_ / "join-service.spki"; }
  std::filesystem::path TrustBundlePath() const { return path_ / "trust-bundle.binpb"; }
  std::filesystem::path ApproverSourcePath() const { return path_ / "trust-approvers.binpb"; }

 private:
  friend absl::StatusOr<nlohmann::json> StateDirStatus(const std::filesystem::path&, int64_t);
  explicit StateDir(std::filesystem::path path) : path_(std::move(path)) {}
  std::filesystem::path path_;
};

// What the state dir says of this node: the "version", "state_dir", "node", "certificate" and
// "trust" fields of `bcd status --json` (docs/operations.md); "node" holds an "error" when the
// identity is missing or unreadable, "trust" one when the bundle is. Reads only: nothing is created
// or changed. PermissionDenied (naming the directory) when this user cannot read it.
absl::StatusOr<nlohmann::json> StateDirStatus(const std::filesystem::path& state_dir, int64_t now);
// The status as `bcd status` prints it for people, "key: value" lines.
std::string StatusText(const nlohmann::json& status);

}  // namespace bcd
