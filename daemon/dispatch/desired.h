#pragma once

// Desired state: the control plane's SignedSpec for this node. A spec is taken only when it is for
// this node, carries a valid `spec` signature by a worker key chaining to a command-signing root
// (whenever the trust bundle has roots), and has a greater generation than the applied one. Each
// section it sets goes to the applier its mode registered; a section with none is reported
// UNSUPPORTED, never dropped. The applied spec is persisted (<state_dir>/spec.binpb, 0600) and
// applied again at the next start, and its generation and per-section status go into Hello and
// StatusReport.
//
// Thread-safe.

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/log.h"
#include "base/mutex.h"
#include "bettercompute/agent/v1/session.pb.h"
#include "bettercompute/agent/v1/spec.pb.h"
#include "pki/trust.h"

namespace bcd {

class DesiredState {
 public:
  using Applier = std::function<absl::Status(const bettercompute::agent::v1::NodeSpec&)>;

  // Loads the persisted spec (DataLoss naming the file when it does not decode); Reapply() applies
  // it once the appliers are registered.
  static absl::StatusOr<std::unique_ptr<DesiredState>> Open(const std::filesystem::path& dir,
                                                            std::string node_id, Logger* log);

  // `section` is the NodeSpec field name ("daemon", "access", ...). The applier's OK means
  // APPLIED (all of the section is in effect), FailedPrecondition PENDING (waits on something
  // else, message says what), Unimplemented UNSUPPORTED (the message says what of it is taken and
  // what is not), any other error FAILED.
  void Register(const std::string& section, Applier apply);
  // Applies the persisted spec again (at start).
  void Reapply();
  // Takes `signed_spec` if it passes the checks above and answers with the SpecAck for the
  // gateway: APPLIED (sections carry their own status), or REJECTED with a code (INVALID,
  // WRONG_NODE, UNSIGNED, BAD_SIGNATURE, STALE, NOT_PERSISTED) and a message naming what was wrong.
  // `signed_only`: as Dispatcher::Submit; a spec must be signed even without roots (and then
  // cannot be taken).
  bettercompute::agent::v1::SpecAck Offer(const bettercompute::agent::v1::SignedSpec& signed_spec,
                                          const pki::TrustState& trust, int64_t now,
                                          bool signed_only = false);

  uint64_t applied_generation() const;
  std::vector<bettercompute::agent::v1::SectionStatus> sections() const;
  // The access section's tunnel-ticket JWKS (JSON text), empty when none was given.
  std::string tunnel_jwks() const;
  // The access section of the applied spec (empty when none).
  bettercompute::agent::v1::AccessSection access() const;
  // The applied spec, all of it (a mode reads its own sections here).
  bettercompute::agent::v1::NodeSpec applied() const;

 private:
  DesiredState(std::filesystem::path path, std::string node_id, Logger* log)
      : path_(std::move(path)), node_id_(std::move(node_id)), log_(log) {}
  // Applies `spec`'s sections; called with mu_ held.
  void ApplyLocked(const bettercompute::agent::v1::NodeSpec& spec)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::filesystem::path path_;
  std::string node_id_;
  Logger* log_;
  // Held while the appliers run (a whole spec applies at once): a mode's applier may take its
  // own locks after it, and must not call back into DesiredState.
  mutable Mutex mu_;
  std::map<std::string, Applier> appliers_ ABSL_GUARDED_BY(mu_);
  bettercompute::agent::v1::NodeSpec spec_ ABSL_GUARDED_BY(mu_);  // applied
  std::vector<bettercompute::agent::v1::SectionStatus> sections_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bcd
