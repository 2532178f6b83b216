#pragma once

// The session engine: dial, Hello, Welcome, serve frames until the stream ends, redial with backoff
// (full jitter, 1 s base, 60 s cap, the gateway's pushback wins), and stop with a clear error on a
// refusal only a person can fix (revoked, unknown-node, trust-domain-mismatch).
//
// Threading: Run() blocks its caller's thread and owns the stream; Stop() and Snapshot() may be
// called from any thread. While connected, one helper thread sends the periodic StatusReport.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/mutex.h"
#include "bettercompute/agent/v1/session.pb.h"
#include "daemon/delivery/outbox.h"
#include "pki/trust.h"
#include "proto/version.h"
#include "transport/transport.h"

namespace bcd {

struct SessionOptions {
  bettercompute::common::v1::Role role = bettercompute::common::v1::ROLE_NODE;
  proto::ProtocolRange range = proto::kProtocolVersion;
  std::vector<std::string> capabilities;
  UnixClock now;                      // unix seconds
  std::function<double()> uniform01;  // jitter source
  std::chrono::milliseconds status_interval = std::chrono::minutes(5);
  // Every command and spec must be signed (set for the WebSocket transport).
  bool signed_only = false;
  // Whether OpenTunnel is taken; tunnels need the gRPC transport, so a WebSocket session refuses
  // them (an event says so; the gateway's open times out).
  bool tunnels = true;
  std::string boot_id;
  int64_t started_at = 0;
  int64_t certificate_not_after = 0;
  // Called with the trust state after every bundle taken, to persist what it enforces (with the
  // held approver set when the bundle's change of it was refused).
  std::function<void(const pki::TrustState&)> on_trust;
  // A session without Welcome this long after it opened is ended and redialed.
  std::chrono::milliseconds welcome_timeout = std::chrono::seconds(30);
  // Where the session's figures go (frames by case, dials and redials by reason, the outbox,
  // trust); a registry of its own when null. Outlives the engine.
  Metrics* metrics = nullptr;
};

struct SessionSnapshot {
  std::string state = "starting";  // connecting, connected, backoff, stopped
  std::string session_id;
  uint32_t protocol_version = 0;
  bool upgrade_required = false;
  uint64_t trust_version = 0;
  std::string last_error;
  int welcomes = 0;
  int unknown_frames = 0;    // frame cases this build does not know: ignored
  int unhandled_frames = 0;  // known cases nothing here acts on (tunnels, or no handler set)
  std::size_t outbox_pending = 0;
  uint64_t last_acked_seq = 0;
};

class SessionEngine {
 public:
  // `outbox` (owned by the caller) holds the command updates and events not yet acknowledged.
  SessionEngine(transport::Transport* transport, pki::TrustState trust,
                pki::PublicKey join_service_key, SessionOptions options, Outbox* outbox,
                Logger* log);

  // Records an event in the outbox and sends it now when connected. Thread-safe. An error means it
  // could not be persisted (the outbox is full or the disk failed).
  absl::Status Emit(bettercompute::agent::v1::Severity severity, std::string kind,
                    std::string message, const std::map<std::string, std::string>& attributes = {});
  // A command update, through the outbox like an event. Thread-safe. `then` runs once the update
  // is in the outbox (or was refused) and before any Ack can drop it again: the dispatcher records
  // the terminal result there, so a crash between the two leaves the update in the outbox for the
  // next start to find (ResultStore::Reconcile), never a result the gateway cannot receive.
  absl::Status EmitUpdate(const bettercompute::agent::v1::CommandUpdate& update,
                          const std::function<void()>& then = {});
  // A frame outside the outbox (inventory, secret requests, ...): sent now when connected, else
  // dropped; true when it was written. Thread-safe.
  bool Send(const bettercompute::agent::v1::AgentFrame& frame);
  // Where commands and cancels go; without one, command frames are counted as unhandled. Set
  // before Run.
  void set_dispatcher(class Dispatcher* dispatcher) { dispatcher_ = dispatcher; }
  // Where desired state goes; without one, desired_state frames are counted as unhandled. Set
  // before Run.
  void set_desired(class DesiredState* desired) { desired_ = desired; }
  // Where secret and workload-token answers go, and who learns of sessions starting and ending.
  // Set before Run.
  void set_secrets(class SecretClient* secrets) { secrets_ = secrets; }
  // Where OpenTunnel goes (gRPC sessions); without one, those frames are counted as unhandled.
  // Every tunnel of a session ends with it. Set before Run.
  void set_tunnels(class TunnelRunner* tunnels) { tunnels_ = tunnels; }
  // The period of StatusReport from the next one on (the daemon section of desired state).
  void set_status_interval(std::chrono::milliseconds interval) {
    status_interval_ms_ = interval.count();
  }
  ~SessionEngine();

  // Runs until Stop() (OK) or a refusal that needs a person (FailedPrecondition, naming it).
  absl::Status Run();
  // Closes the stream cleanly (the gateway sees the end), cancelling it if the gateway does not end
  // it within 2 s, and makes Run return.
  void Stop();
  SessionSnapshot Snapshot() const;
  // Waits until `done(snapshot)` holds; false on timeout.
  bool WaitUntil(const std::function<bool(const SessionSnapshot&)>& done,
                 std::chrono::milliseconds timeout) const;

 private:
  // One connection: Hello, Welcome (checked), then Converse until it ends.
  transport::Refusal Serve(transport::FrameStream& stream, class Backoff& backoff);
  // The gateway's first frame, cancelling the stream past welcome_timeout (then `*late`).
  bool ReadFirst(transport::FrameStream& stream, bettercompute::agent::v1::ServerFrame* first,
                 bool* late);
  // The session is up: state, what the outbox holds again, secrets, trust, a StatusReport.
  void Welcomed(transport::FrameStream& stream, const bettercompute::agent::v1::Welcome& welcome);
  // Frames in, StatusReports out (on change and periodically), until the stream ends; then the
  // session's tunnels and secret waits end with it.
  void Converse(transport::FrameStream& stream);
  // Both return true when what StatusReport says changed.
  bool Handle(const bettercompute::agent::v1::ServerFrame& frame);
  bool ApplyTrust(const bettercompute::agent::v1::SignedTrustBundle& bundle);
  bettercompute::agent::v1::AgentFrame Hello() const;
  bettercompute::agent::v1::AgentFrame Status() const;
  void SetState(std::string state, std::string error = "");
  // The session's figures (session.cc), and the stream decorator that counts frames.
  struct Figures;
  class CountedStream;

  absl::Status Enqueue(bettercompute::agent::v1::AgentFrame frame,
                       const std::function<void()>& then);
  class Dispatcher* dispatcher_ = nullptr;
  class DesiredState* desired_ = nullptr;
  class SecretClient* secrets_ = nullptr;
  class TunnelRunner* tunnels_ = nullptr;
  std::unique_ptr<Metrics> own_metrics_;  // when the options gave none
  std::unique_ptr<Figures> figures_;
  std::atomic<int64_t> status_interval_ms_{0};
  transport::Transport* transport_;
  pki::TrustState trust_;  // owned by the Run thread
  pki::PublicKey join_service_key_;
  SessionOptions options_;
  Logger* log_;

  // Appending to the outbox and sending in seq order happen under one lock, so an event emitted
  // from another thread never overtakes the replay of older ones.
  // Lock order: outbox_mu_, then mu_ (an Ack updates the snapshot), then the live stream's own
  // write lock (Send writes holding outbox_mu_). Nothing takes outbox_mu_ holding mu_.
  mutable Mutex outbox_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  Outbox* outbox_ ABSL_GUARDED_BY(outbox_mu_);
  transport::FrameStream* live_ ABSL_GUARDED_BY(outbox_mu_) = nullptr;  // set once welcomed

  mutable Mutex mu_;
  mutable CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  transport::FrameStream* current_ ABSL_GUARDED_BY(mu_) = nullptr;
  SessionSnapshot snapshot_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bcd
