#pragma once

// The dispatcher: every command goes through one pipeline driven by the kind table (proto/kinds.h).
//
//   decode -> already finished? (answer the stored result) -> node -> expiry -> signature (kinds
//   flagged signed, when the trust bundle has command-signing roots) -> quorum and hourly limit
//   (kinds flagged quorum) -> kind known to this mode, allowed now -> payload decodes -> ACCEPTED
//
// Each refusal is a REJECTED update with its code and a readable message. Accepted commands queue
// in their lane; a lane runs one command at a time, except a lane run per key (the per-BMC lane),
// which runs one command at a time per key and different keys side by side, up to a bound. A
// command's timeout starts when it runs. Handlers never see the transport.
//
// Thread-safe: Submit and Cancel come from the session thread, updates leave through `hooks.update`
// from lane threads.

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/mutex.h"
#include "bettercompute/agent/v1/commands.pb.h"
#include "daemon/delivery/results.h"
#include "pki/approvals.h"
#include "pki/envelope.h"
#include "pki/trust.h"
#include "proto/kinds.h"

namespace bcd {

class CommandHandler {
 public:
  virtual ~CommandHandler() = default;
  // Checks the payload before the command is accepted: an error is the command's refusal
  // (REJECTED INVALID_PAYLOAD with its message), and it never runs. Runs on the session's thread:
  // no I/O, nothing that blocks.
  virtual absl::Status Validate(const bettercompute::agent::v1::Command& command,
                                const google::protobuf::Message& payload) const {
    (void)command;
    (void)payload;
    return absl::OkStatus();
  }
  // Runs the command and returns the bytes of its kind's result message. `stop` turns true on
  // cancel, timeout or shutdown; a handler checks it (and hands it to the blocking calls it makes)
  // and returns within a second or two. Runs on its lane's thread.
  virtual absl::StatusOr<std::string> Run(const bettercompute::agent::v1::Command& command,
                                          const google::protobuf::Message& payload,
                                          const std::atomic<bool>& stop) = 0;
  // The full protobuf names of the payload and result messages it works with; empty for a handler
  // that takes any kind (tests). Register refuses a handler whose types are not its kind's.
  virtual std::string_view payload_type() const { return {}; }
  virtual std::string_view result_type() const { return {}; }
  // What the command works on, for lanes run per key (proto::Lane::kPerBmc: the BMC's address):
  // commands with the same key run one at a time, different keys side by side. Empty: the lane's
  // one shared key. Runs on the session's thread after Validate.
  virtual std::string LaneKey(const bettercompute::agent::v1::Command& command,
                              const google::protobuf::Message& payload) const {
    (void)command;
    (void)payload;
    return {};
  }
};

// A handler with its kind's payload and result types. The dispatcher decodes the payload into the
// type the kind table names, and Register checks that it is `Payload`: the one conversion below is
// safe by construction, and no handler casts.
template <typename Payload, typename Result>
class TypedHandler : public CommandHandler {
 public:
  // Checks the payload before the command is accepted (see CommandHandler::Validate).
  virtual absl::Status Check(const bettercompute::agent::v1::Command& command,
                             const Payload& payload) const {
    (void)command;
    (void)payload;
    return absl::OkStatus();
  }
  // Runs the command (see CommandHandler::Run).
  virtual absl::StatusOr<Result> Execute(const bettercompute::agent::v1::Command& command,
                                         const Payload& payload, const std::atomic<bool>& stop) = 0;

  // The lane key (see CommandHandler::LaneKey).
  virtual std::string Key(const bettercompute::agent::v1::Command& command,
                          const Payload& payload) const {
    (void)command;
    (void)payload;
    return {};
  }

  std::string_view payload_type() const final { return Payload::descriptor()->full_name(); }
  std::string_view result_type() const final { return Result::descriptor()->full_name(); }

 private:
  std::string LaneKey(const bettercompute::agent::v1::Command& command,
                      const google::protobuf::Message& payload) const final {
    return Key(command, static_cast<const Payload&>(payload));
  }
  absl::Status Validate(const bettercompute::agent::v1::Command& command,
                        const google::protobuf::Message& payload) const final {
    return Check(command, static_cast<const Payload&>(payload));
  }
  absl::StatusOr<std::string> Run(const bettercompute::agent::v1::Command& command,
                                  const google::protobuf::Message& payload,
                                  const std::atomic<bool>& stop) final {
    absl::StatusOr<Result> result = Execute(command, static_cast<const Payload&>(payload), stop);
    if (!result.ok()) return result.status();
    return result->SerializeAsString();
  }
};

struct DispatcherHooks {
  std::function<void(const bettercompute::agent::v1::CommandUpdate&)> update;  // into the outbox
  // A terminal update: into the outbox, then `remember()` records it in the result store, before
  // an Ack can drop the update (SessionEngine::EmitUpdate). Unset: remember(), then update().
  std::function<void(const bettercompute::agent::v1::CommandUpdate&,
                     const std::function<void()>& remember)>
      terminal;
  UnixClock now;
  // An event for the gateway (kind, message): results.full when the result store fills up.
  std::function<void(const std::string&, const std::string&)> event;
  // Where commands are counted (by kind and terminal state, refusals by code, those in hand); a
  // registry of the dispatcher's own when null. Outlives the dispatcher.
  Metrics* metrics = nullptr;
};

// What a handler returns when the process is about to be replaced and the command goes on in the
// next one (daemon.upgrade re-executing bcd): the command stays marked running, unreported, for
// the next process to report (Dispatcher::ReportInterrupted's `claimed`, Dispatcher::Resolve).
absl::Status HandedOver(std::string_view why);
bool IsHandedOver(const absl::Status& status);

// Tolerated difference between the control plane's clock and this node's, for issued_at.
inline constexpr int64_t kCommandClockSkew = 300;
inline constexpr std::size_t kMaxCommandIdBytes = 128;
// Letters, digits and -_.: (1 to kMaxCommandIdBytes, starting with a letter or digit): an id can
// never name a path or break a log line.
bool IsCommandId(std::string_view id);

// Lanes run per key (proto::Lane::kPerBmc) run at most this many commands at once by default.
inline constexpr std::size_t kKeyedLaneWorkers = 8;

class Dispatcher {
 public:
  // `keyed_workers`: how many commands a lane run per key runs at once (one per key at most);
  // every other lane runs one command at a time.
  Dispatcher(proto::Mode mode, std::string node_id, ResultStore* results, DispatcherHooks hooks,
             Logger* log, std::size_t keyed_workers = kKeyedLaneWorkers);
  ~Dispatcher();

  // Adds the handler of `kind`. InvalidArgument when the kind table has no such kind, gives it to
  // another mode, or names other payload or result types than a typed handler's; AlreadyExists
  // when the kind has a handler: a mode that registers wrongly does not start.
  absl::Status Register(const std::string& kind, std::unique_ptr<CommandHandler> handler);
  // The kinds the table gives this mode that have no handler in this build (refused UNSUPPORTED,
  // saying so); the agent reports them at start.
  std::vector<std::string> Unhandled() const;
  // Reports every command a previous run left running as FAILED (interrupted), unless its kind is
  // idempotent; those run again when redelivered.
  // `claimed`: ids whose handler reports them itself (a daemon.upgrade on trial across the
  // restart): left running, and a redelivery of one is not run again.
  void ReportInterrupted(const std::set<std::string>& claimed = {});
  // Concludes a command a previous process left running (the daemon.upgrade the new version
  // confirms, or the old one reports rolled back): sent through the outbox and remembered, once.
  void Resolve(const bettercompute::agent::v1::CommandUpdate& terminal);
  // `signed_only`: the session is one where every command must carry a valid signature whatever
  // its kind (WebSocket through a proxy that strips client certificates).
  void Submit(const bettercompute::agent::v1::SignedCommand& signed_command,
              const pki::TrustState& trust, bool upgrade_required, bool signed_only = false);
  void Cancel(const std::string& command_id, const std::string& reason);
  // Commands queued or running.
  std::size_t InHand() const;

 private:
  struct Job;
  struct Lane;
  // One command on its way in, and what the admission steps learn of it.
  struct Admission;
  // What an admission step decided when it stops the command: refused with a code, or (no code)
  // answered already.
  struct Stop {
    std::optional<bettercompute::agent::v1::CommandCode> code;
    std::string message;
    bool never_remembered = false;  // a refusal that is not the id's result even when verified
  };
  using Step = std::optional<Stop>;  // nullopt: on to the next step
  // The admission steps, in the order Submit takes them (see the top of this file).
  Step Remembered(Admission& a);  // the id's form, and whether it was answered or is in hand
  Step ForThisNodeAndNow(Admission& a);
  Step Signature(Admission& a, bool signed_only);
  Step Approvals(Admission& a);
  Step KindOfThisMode(Admission& a, bool upgrade_required);
  Step Payload(Admission& a);
  Step RoomForTheResult(Admission& a);
  Step HourlyLimit(Admission& a);
  void Enqueue(Admission& a);
  void Refuse(const Admission& a, const Stop& stop);
  // Sends REJECTED; with `remember_with_body` (the SHA-256 of the command body) it is recorded as
  // the id's result too.
  void Reject(const std::string& id, bettercompute::agent::v1::CommandCode code,
              const std::string& message, const std::optional<std::string>& remember_with_body);
  void Finish(Job& job, bettercompute::agent::v1::CommandUpdate update);
  // Sends a terminal update and records it in the result store with the body's hash.
  void Conclude(const bettercompute::agent::v1::CommandUpdate& update,
                const std::string& body_sha256);
  void LaneLoop(Lane* lane);
  void Watch();  // sets `stop` on commands past their deadline
  bettercompute::agent::v1::CommandUpdate Update(
      const std::string& id, bettercompute::agent::v1::CommandState state) const;

  proto::Mode mode_;
  std::unique_ptr<Metrics> own_metrics_;  // when the hooks gave none
  CounterFamily* commands_;               // by kind and terminal state
  CounterFamily* refusals_;               // by code
  std::size_t keyed_workers_;
  std::string node_id_;
  DispatcherHooks hooks_;
  Logger* log_;
  std::map<std::string, std::unique_ptr<CommandHandler>> handlers_;
  pki::ChainVerifier chains_;  // the worker chains that verified

  mutable Mutex mu_;
  CondVar cv_;
  ResultStore* results_ ABSL_GUARDED_BY(mu_);
  std::map<proto::Lane, std::unique_ptr<Lane>> lanes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<Job>> active_
      ABSL_GUARDED_BY(mu_);  // queued or running, by id
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool results_full_ ABSL_GUARDED_BY(mu_) = false;  // results.full was reported and still holds
  std::thread watchdog_;
};

}  // namespace bcd
