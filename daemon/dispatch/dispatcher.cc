#include "daemon/dispatch/dispatcher.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/cord.h"
#include "base/mutex.h"
#include "fmt/format.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "pki/envelope.h"
#include "pki/keys.h"
#include "proto/absl_compat.h"
#include "proto/frame_codec.h"
#include "proto/signing_input.h"

namespace bcd {

namespace v1 = bettercompute::agent::v1;
using Clock = std::chrono::steady_clock;

// Fields marked "guarded by the dispatcher's mu_" are read and written holding Dispatcher::mu_
// (clang's analysis cannot name another object's mutex, so they carry a comment, not an
// annotation).
struct Dispatcher::Job {
  v1::Command command;
  std::string body;
  std::string body_sha256;
  const proto::KindSpec* kind = nullptr;
  std::unique_ptr<google::protobuf::Message> payload;
  std::string lane_key;  // see CommandHandler::LaneKey
  std::atomic<bool> stop{false};
  bool running = false;        // guarded by the dispatcher's mu_
  bool timed_out = false;      // guarded by the dispatcher's mu_
  std::string cancel_reason;   // guarded by the dispatcher's mu_; set when cancelled
  Clock::time_point deadline;  // guarded by the dispatcher's mu_; set when it starts running
};

// A lane's workers take the first queued job whose key no worker is running: one at a time per
// key, and (with more than one worker, for lanes run per key) different keys side by side.
// Workers start when a job finds none idle, up to `workers`, and live as long as the dispatcher.
struct Dispatcher::Lane {
  std::size_t workers = 1;
  std::deque<std::shared_ptr<Job>> queue;  // guarded by the dispatcher's mu_
  std::set<std::string> running_keys;      // guarded by the dispatcher's mu_
  std::size_t idle = 0;              // guarded by the dispatcher's mu_; workers waiting for a job
  std::vector<std::thread> threads;  // guarded by the dispatcher's mu_

  // The first queued job no worker runs the key of; null when there is none.
  std::shared_ptr<Job> Next() {
    for (auto it = queue.begin(); it != queue.end(); ++it) {
      if (running_keys.contains((*it)->lane_key)) continue;
      std::shared_ptr<Job> job = *it;
      queue.erase(it);
      return job;
    }
    return nullptr;
  }
};

Dispatcher::Dispatcher(proto::Mode mode, std::string node_id, ResultStore* results,
                       DispatcherHooks hooks, Logger* log, std::size_t keyed_workers)
    : mode_(mode),
      keyed_workers_(std::max<std::size_t>(keyed_workers, 1)),
      node_id_(std::move(node_id)),
      hooks_(std::move(hooks)),
      log_(log),
      results_(results) {
  if (hooks_.metrics == nullptr) {
    own_metrics_ = std::make_unique<Metrics>();
    hooks_.metrics = own_metrics_.get();
  }
  commands_ = &hooks_.metrics->Counter("bcd_commands_total",
                                       "Commands run to a terminal state, by kind and state",
                                       {"kind", "state"});
  refusals_ = &hooks_.metrics->Counter("bcd_command_refusals_total",
                                       "Commands refused at admission, by code", {"code"});
  hooks_.metrics->Collect(
      "bcd_commands_in_hand", "Commands queued or running, by state", MetricType::kGauge, {"state"},
      [this] {
        double queued = 0, running = 0;
        MutexLock lock(mu_);
        for (const auto& [id, job] : active_) ++(job->running ? running : queued);
        return std::vector<Sample>{{{"queued"}, queued}, {{"running"}, running}};
      });
  watchdog_ = std::thread([this] { Watch(); });
}

Dispatcher::~Dispatcher() {
  hooks_.metrics->Forget("bcd_commands_in_hand");
  std::vector<std::thread> threads;
  {
    MutexLock lock(mu_);
    stopping_ = true;
    for (auto& [id, job] : active_) job->stop = true;
    for (auto& [lane, state] : lanes_) {
      for (std::thread& thread : state->threads) threads.push_back(std::move(thread));
    }
  }
  cv_.notify_all();
  for (std::thread& t : threads) t.join();
  watchdog_.join();
}

absl::Status Dispatcher::Register(const std::string& kind,
                                  std::unique_ptr<CommandHandler> handler) {
  const proto::KindSpec* spec = proto::FindKind(kind);
  if (spec == nullptr) {
    return absl::InvalidArgumentError(fmt::format("kind \"{}\" is not in the kind table", kind));
  }
  if (!spec->RunsIn(mode_)) {
    return absl::InvalidArgumentError(fmt::format(
        "kind \"{}\" does not run in {} mode (the kind table)", kind, proto::ModeName(mode_)));
  }
  for (auto [declared, table] : {std::pair{handler->payload_type(), spec->payload_type},
                                 std::pair{handler->result_type(), spec->result_type}}) {
    if (!declared.empty() && declared != table) {
      return absl::InvalidArgumentError(fmt::format(
          "the handler of \"{}\" works with {}, the kind table says {}", kind, declared, table));
    }
  }
  if (!handlers_.emplace(kind, std::move(handler)).second) {
    return absl::AlreadyExistsError(fmt::format("kind \"{}\" has a handler already", kind));
  }
  return absl::OkStatus();
}

std::vector<std::string> Dispatcher::Unhandled() const {
  std::vector<std::string> kinds;
  for (const proto::KindSpec* kind : proto::KindsForMode(mode_)) {
    if (!handlers_.contains(std::string(kind->name))) kinds.emplace_back(kind->name);
  }
  return kinds;
}

v1::CommandUpdate Dispatcher::Update(const std::string& id, v1::CommandState state) const {
  v1::CommandUpdate update;
  update.set_command_id(id);
  update.set_state(state);
  update.set_time_ms(static_cast<uint64_t>(hooks_.now()) * 1000);
  return update;
}

void Dispatcher::Reject(const std::string& id, v1::CommandCode code, const std::string& message,
                        const std::optional<std::string>& remember_with_body) {
  v1::CommandUpdate update = Update(id, v1::COMMAND_STATE_REJECTED);
  update.set_code(code);
  update.set_message(message);
  log_->Warn("command.rejected",
             {{"command_id", id}, {"code", v1::CommandCode_Name(code)}, {"message", message}});
  refusals_->Add({EnumLabel(v1::CommandCode_Name(code), "COMMAND_CODE_")});
  if (!remember_with_body) return hooks_.update(update);
  Conclude(update, *remember_with_body);
}

void Dispatcher::Conclude(const v1::CommandUpdate& update, const std::string& body_sha256) {
  auto remember = [&] {
    MutexLock lock(mu_);
    if (absl::Status s = results_->Remember(update, hooks_.now(), body_sha256); !s.ok()) {
      log_->Warn("command.not_recorded",
                 {{"command_id", update.command_id()}, {"error", std::string(ToStd(s.message()))}});
    }
  };
  if (hooks_.terminal) return hooks_.terminal(update, remember);
  remember();
  hooks_.update(update);
}

void Dispatcher::Resolve(const v1::CommandUpdate& terminal) {
  {
    MutexLock lock(mu_);
    if (results_->Lookup(terminal.command_id())) return;  // answered already
  }
  std::string kind;
  {
    MutexLock lock(mu_);
    if (auto it = results_->running().find(terminal.command_id()); it != results_->running().end())
      kind = it->second;
  }
  log_->Info("command.done", {{"command_id", terminal.command_id()},
                              {"state", v1::CommandState_Name(terminal.state())}});
  if (!kind.empty()) {
    commands_->Add({kind, EnumLabel(v1::CommandState_Name(terminal.state()), "COMMAND_STATE_")});
  }
  Conclude(terminal, "");
}

std::size_t Dispatcher::InHand() const {
  MutexLock lock(mu_);
  return active_.size();
}

void Dispatcher::ReportInterrupted(const std::set<std::string>& claimed) {
  std::map<std::string, std::string> interrupted;
  {
    MutexLock lock(mu_);
    interrupted = results_->running();
  }
  for (const auto& [id, kind] : interrupted) {
    if (claimed.contains(id)) continue;  // its handler reports it (daemon.upgrade)
    const proto::KindSpec* spec = proto::FindKind(kind);
    if (spec != nullptr && spec->Has(proto::kIdempotent))
      continue;  // may run again when redelivered
    v1::CommandUpdate update = Update(id, v1::COMMAND_STATE_FAILED);
    update.set_code(v1::COMMAND_CODE_INTERRUPTED);
    update.set_message("bcd restarted while the command ran");
    if (spec != nullptr) commands_->Add({kind, "failed"});
    Conclude(update, "");
  }
}

namespace {

// Every command expires, and lives no longer than its result is remembered.
absl::Status CheckLifetime(const v1::Command& command, int64_t now) {
  int64_t issued = static_cast<int64_t>(std::min<uint64_t>(command.issued_at(), INT64_MAX / 2));
  int64_t expires = static_cast<int64_t>(std::min<uint64_t>(command.expires_at(), INT64_MAX / 2));
  if (expires == 0) {
    return absl::FailedPreconditionError(
        "the command has no expires_at: bcd runs only commands that expire");
  }
  if (expires < now) {
    return absl::FailedPreconditionError(
        fmt::format("the command expired at {} (now {})", expires, now));
  }
  if (issued == 0 || issued > now + kCommandClockSkew) {
    return absl::FailedPreconditionError(fmt::format(
        "issued_at {} is {}: it must be set and at most {} s ahead of this node's clock (now {})",
        issued, issued == 0 ? "unset" : "in the future", kCommandClockSkew, now));
  }
  // A result is remembered for ResultStore::kKeepSeconds after the command ends, so a command
  // that may still be delivered later than that could run again: its life must be shorter.
  if (expires - issued > ResultStore::kKeepSeconds || expires - now > ResultStore::kKeepSeconds) {
    return absl::FailedPreconditionError(fmt::format(
        "the command lives until {} ({} s after issued_at {}): at most {} s, the time bcd "
        "remembers a result",
        expires, expires - issued, issued, ResultStore::kKeepSeconds));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {
constexpr std::string_view kHandedOver = "bcd.handed_over";
}

absl::Status HandedOver(std::string_view why) {
  absl::Status status = absl::AbortedError(ToAbsl(why));
  status.SetPayload(ToAbsl(kHandedOver), absl::Cord("1"));
  return status;
}

bool IsHandedOver(const absl::Status& status) {
  return status.GetPayload(ToAbsl(kHandedOver)).has_value();
}

bool IsCommandId(std::string_view id) {
  if (id.empty() || id.size() > kMaxCommandIdBytes ||
      !std::isalnum(static_cast<unsigned char>(id[0])))
    return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
           c == ':';
  });
}

struct Dispatcher::Admission {
  const v1::SignedCommand& signed_command;
  const pki::TrustState& trust;
  std::shared_ptr<Job> job;
  std::string body_sha256;
  // Refusals of what did not verify are answered but not remembered: anyone who can put a frame
  // on the session could otherwise fill the disk with them. Only a command whose signature
  // verified has its refusal kept like a result.
  bool verified = false;
  int64_t now = 0;
  const proto::KindSpec* kind = nullptr;
  CommandHandler* handler = nullptr;
};

void Dispatcher::Submit(const v1::SignedCommand& signed_command, const pki::TrustState& trust,
                        bool upgrade_required, bool signed_only) {
  Admission a{.signed_command = signed_command, .trust = trust, .job = std::make_shared<Job>()};
  if (absl::Status s = proto::DecodeMessage(signed_command.body(), &a.job->command); !s.ok()) {
    log_->Warn("command.undecodable", {{"error", std::string(ToStd(s.message()))}});
    return;  // no command id to answer
  }
  if (a.job->command.command_id().empty()) {
    log_->Warn("command.undecodable", {{"error", "no command_id"}});
    return;
  }
  a.body_sha256 = pki::Sha256(signed_command.body());
  Step stop = Remembered(a);
  if (!stop) stop = ForThisNodeAndNow(a);
  if (!stop) stop = Signature(a, signed_only);
  if (!stop) stop = Approvals(a);
  if (!stop) stop = KindOfThisMode(a, upgrade_required);
  if (!stop) stop = Payload(a);
  if (!stop) stop = RoomForTheResult(a);
  if (!stop) stop = HourlyLimit(a);
  if (!stop) return Enqueue(a);
  if (stop->code) Refuse(a, *stop);
}

void Dispatcher::Refuse(const Admission& a, const Stop& stop) {
  bool remembered = a.verified && !stop.never_remembered;
  Reject(a.job->command.command_id(), *stop.code, stop.message,
         remembered ? std::optional<std::string>(a.body_sha256) : std::nullopt);
}

Dispatcher::Step Dispatcher::Remembered(Admission& a) {
  const std::string& id = a.job->command.command_id();
  if (!IsCommandId(id)) {
    return Stop{v1::COMMAND_CODE_INVALID_PAYLOAD,
                fmt::format("command_id must be 1 to {} letters, digits and -_.: starting with a "
                            "letter or digit",
                            kMaxCommandIdBytes)};
  }
  std::optional<ResultStore::Stored> done;
  bool in_hand = false, same = false;
  {
    MutexLock lock(mu_);
    done = results_->Lookup(id);
    if (auto it = active_.find(id); it != active_.end()) {
      in_hand = true;
      same = it->second->body == a.signed_command.body();
    } else if (results_->Running(id)) {
      // Left running by a previous process and reported by its handler (a daemon.upgrade on
      // trial): a redelivery waits for that report.
      in_hand = same = true;
    }
  }
  if (done && !done->body_sha256.empty() && done->body_sha256 != a.body_sha256) {
    // Not remembered as the id's result: that is the first command's.
    return Stop{v1::COMMAND_CODE_DUPLICATE, "a different command with this id was answered before"};
  }
  if (done) {
    log_->Info("command.redelivered", {{"command_id", id}});
    hooks_.update(done->update);  // answered from memory: it never runs twice
    return Stop{};
  }
  if (in_hand && same) return Stop{};  // a redelivery of what is queued or running
  if (in_hand) {
    return Stop{v1::COMMAND_CODE_DUPLICATE, "a different command with this id is in hand"};
  }
  return std::nullopt;
}

Dispatcher::Step Dispatcher::ForThisNodeAndNow(Admission& a) {
  const v1::Command& command = a.job->command;
  if (command.node_id() != node_id_) {
    return Stop{
        v1::COMMAND_CODE_WRONG_NODE,
        fmt::format("the command is for node \"{}\", this is \"{}\"", command.node_id(), node_id_)};
  }
  a.now = hooks_.now();
  if (absl::Status s = CheckLifetime(command, a.now); !s.ok()) {
    return Stop{v1::COMMAND_CODE_EXPIRED, std::string(ToStd(s.message()))};
  }
  a.kind = proto::FindKind(command.kind());
  return std::nullopt;
}

Dispatcher::Step Dispatcher::Signature(Admission& a, bool signed_only) {
  const v1::SignedCommand& signed_command = a.signed_command;
  bool signing_on = !a.trust.command_signing_roots().empty();
  bool has_signature = !signed_command.signature().sig().empty();
  std::string input = proto::BodySigningInput(proto::Purpose::kCommand, signed_command.body());
  if (has_signature && signing_on) {
    if (absl::Status s = chains_.Verify(input, signed_command.signature(),
                                        a.trust.command_signing_roots(), a.now);
        !s.ok()) {
      return Stop{v1::COMMAND_CODE_BAD_SIGNATURE, fmt::format("signature: {}", ToStd(s.message()))};
    }
    a.verified = true;
  } else if (signed_only && !signing_on) {
    return Stop{v1::COMMAND_CODE_BAD_SIGNATURE,
                "this session takes only signed commands and the trust bundle has no "
                "command-signing roots to verify them with"};
  } else if (signed_only || (signing_on && a.kind != nullptr && a.kind->Has(proto::kSigned))) {
    return Stop{v1::COMMAND_CODE_UNSIGNED,
                signed_only ? "this session takes only signed commands"
                            : fmt::format("{} commands must be signed", a.job->command.kind())};
  }
  return std::nullopt;
}

Dispatcher::Step Dispatcher::Approvals(Admission& a) {
  if (a.kind == nullptr || !a.kind->Has(proto::kQuorum)) return std::nullopt;
  absl::Status approved =
      pki::CheckApprovals(a.signed_command.body(), a.job->command, a.signed_command.approvals(),
                          a.signed_command.batch_manifest(), node_id_, a.trust.approvers());
  if (approved.ok()) return std::nullopt;
  v1::CommandCode code =
      approved.code() == absl::StatusCode::kUnauthenticated   ? v1::COMMAND_CODE_BAD_SIGNATURE
      : approved.code() == absl::StatusCode::kInvalidArgument ? v1::COMMAND_CODE_INVALID_PAYLOAD
                                                              : v1::COMMAND_CODE_QUORUM;
  return Stop{code, std::string(ToStd(approved.message()))};
}

Dispatcher::Step Dispatcher::KindOfThisMode(Admission& a, bool upgrade_required) {
  const std::string& kind = a.job->command.kind();
  if (a.kind == nullptr || !a.kind->RunsIn(mode_)) {
    return Stop{v1::COMMAND_CODE_UNSUPPORTED,
                fmt::format("kind \"{}\" is not supported by this {} daemon", kind,
                            proto::ModeName(mode_))};
  }
  auto handler = handlers_.find(kind);
  if (handler == handlers_.end()) {
    return Stop{v1::COMMAND_CODE_UNSUPPORTED,
                fmt::format("kind \"{}\" is a {} mode kind this build does not run yet", kind,
                            proto::ModeName(mode_))};
  }
  if (upgrade_required && !a.kind->Has(proto::kUpgradeOk)) {
    return Stop{v1::COMMAND_CODE_UNSUPPORTED,
                "the gateway requires an upgrade: only daemon.upgrade runs until then"};
  }
  a.handler = handler->second.get();
  return std::nullopt;
}

Dispatcher::Step Dispatcher::Payload(Admission& a) {
  const v1::Command& command = a.job->command;
  const google::protobuf::Descriptor* type =
      google::protobuf::DescriptorPool::generated_pool()->FindMessageTypeByName(
          std::string(a.kind->payload_type));
  a.job->payload.reset(
      google::protobuf::MessageFactory::generated_factory()->GetPrototype(type)->New());
  if (absl::Status s = proto::DecodeMessage(command.payload(), a.job->payload.get()); !s.ok()) {
    return Stop{v1::COMMAND_CODE_INVALID_PAYLOAD, std::string(ToStd(s.message()))};
  }
  if (absl::Status s = a.handler->Validate(command, *a.job->payload); !s.ok()) {
    // Unimplemented: this node cannot take the kind as configured (daemon.upgrade without keys).
    return Stop{s.code() == absl::StatusCode::kUnimplemented ? v1::COMMAND_CODE_UNSUPPORTED
                                                             : v1::COMMAND_CODE_INVALID_PAYLOAD,
                std::string(ToStd(s.message()))};
  }
  a.job->lane_key = a.handler->LaneKey(command, *a.job->payload);
  return std::nullopt;
}

// Taken only when its result will fit: a command that runs is always remembered.
Dispatcher::Step Dispatcher::RoomForTheResult(Admission& a) {
  absl::Status room;
  bool newly_full = false;
  {
    MutexLock lock(mu_);
    room = results_->Room(a.now);
    newly_full = !room.ok() && !results_full_;
    results_full_ = !room.ok();
  }
  if (room.ok()) return std::nullopt;
  std::string why(ToStd(room.message()));
  if (newly_full && hooks_.event) hooks_.event("results.full", why);
  return Stop{v1::COMMAND_CODE_BUSY, why, /*never_remembered=*/true};
}

Dispatcher::Step Dispatcher::HourlyLimit(Admission& a) {
  if (!a.kind->Has(proto::kQuorum) || !a.job->command.batch_id().empty() ||
      a.trust.approvers().empty()) {
    return std::nullopt;
  }
  absl::Status limited;
  {
    MutexLock lock(mu_);
    limited = results_->TakeHourly(a.now, a.trust.approvers().unbatched_destructive_per_hour());
  }
  if (absl::IsResourceExhausted(limited)) {
    return Stop{v1::COMMAND_CODE_RATE_LIMITED, std::string(ToStd(limited.message()))};
  }
  if (!limited.ok()) {
    return Stop{v1::COMMAND_CODE_INTERNAL,
                fmt::format("the hourly count of destructive commands could not be recorded: {}",
                            ToStd(limited.message()))};
  }
  return std::nullopt;
}

void Dispatcher::Enqueue(Admission& a) {
  std::shared_ptr<Job> job = a.job;
  const std::string& id = job->command.command_id();
  const proto::KindSpec* kind = a.kind;
  job->kind = kind;
  job->body = a.signed_command.body();
  job->body_sha256 = a.body_sha256;
  {
    MutexLock lock(mu_);
    if (stopping_) return;
    // The marker tells a restart what it interrupted. An idempotent kind may simply run again,
    // so it goes without (one sync less on the way of the cheapest commands).
    absl::Status s = kind->Has(proto::kIdempotent) ? absl::OkStatus()
                                                   : results_->MarkRunning(id, job->command.kind());
    if (!s.ok()) {
      log_->Warn("command.not_recorded",
                 {{"command_id", id}, {"error", std::string(ToStd(s.message()))}});
    }
    active_[id] = job;
  }
  // ACCEPTED goes out before the lane can see the job, so it always precedes RUNNING.
  hooks_.update(Update(id, v1::COMMAND_STATE_ACCEPTED));
  {
    MutexLock lock(mu_);
    if (stopping_ || !job->cancel_reason.empty()) return;  // cancelled meanwhile: answered there
    std::unique_ptr<Lane>& lane = lanes_[kind->lane];
    if (!lane) {
      lane = std::make_unique<Lane>();
      lane->workers = kind->lane == proto::Lane::kPerBmc ? keyed_workers_ : 1;
    }
    lane->queue.push_back(job);
    if (lane->idle == 0 && lane->threads.size() < lane->workers) {
      lane->threads.emplace_back([this, l = lane.get()] { LaneLoop(l); });
    }
  }
  cv_.notify_all();
}

void Dispatcher::Cancel(const std::string& command_id, const std::string& reason) {
  std::shared_ptr<Job> job;
  bool queued = false;
  {
    MutexLock lock(mu_);
    auto it = active_.find(command_id);
    if (it == active_.end()) return;
    job = it->second;
    job->cancel_reason = reason.empty() ? "cancelled" : reason;
    job->stop = true;
    if (!job->running) {
      queued = true;
      if (auto lane = lanes_.find(job->kind->lane); lane != lanes_.end())
        std::erase(lane->second->queue, job);
    }
  }
  if (queued) {
    v1::CommandUpdate update = Update(command_id, v1::COMMAND_STATE_CANCELLED);
    update.set_message(job->cancel_reason);
    Finish(*job, update);
  }
}

void Dispatcher::Finish(Job& job, v1::CommandUpdate update) {
  log_->Info("command.done", {{"command_id", job.command.command_id()},
                              {"state", v1::CommandState_Name(update.state())}});
  commands_->Add(
      {job.command.kind(), EnumLabel(v1::CommandState_Name(update.state()), "COMMAND_STATE_")});
  Conclude(update, job.body_sha256);
  MutexLock lock(mu_);
  active_.erase(job.command.command_id());
}

void Dispatcher::LaneLoop(Lane* lane) {
  UniqueLock lock(mu_);
  while (true) {
    std::shared_ptr<Job> job;
    ++lane->idle;
    cv_.wait(lock, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || (job = lane->Next()) != nullptr;
    });
    --lane->idle;
    if (stopping_) return;
    lane->running_keys.insert(job->lane_key);
    job->running = true;
    auto timeout = job->kind->Has(proto::kTimeoutFromPayload) || job->command.timeout_seconds() != 0
                       ? std::chrono::seconds(job->command.timeout_seconds())
                       : std::chrono::duration_cast<std::chrono::seconds>(job->kind->timeout);
    job->deadline = Clock::now() + (timeout.count() > 0 ? timeout : std::chrono::seconds(60));
    lock.unlock();
    cv_.notify_all();  // the watchdog learns the new deadline
    hooks_.update(Update(job->command.command_id(), v1::COMMAND_STATE_RUNNING));
    absl::StatusOr<std::string> result =
        handlers_.at(job->command.kind())->Run(job->command, *job->payload, job->stop);
    if (!result.ok() && IsHandedOver(result.status())) {
      // Still running: the process that comes next reports it.
      log_->Info("command.handed_over", {{"command_id", job->command.command_id()},
                                         {"why", std::string(ToStd(result.status().message()))}});
      lock.lock();
      active_.erase(job->command.command_id());
      lane->running_keys.erase(job->lane_key);
      cv_.notify_all();
      continue;
    }
    lock.lock();
    bool timed_out = job->timed_out;
    std::string cancelled = job->cancel_reason;
    lock.unlock();
    v1::CommandUpdate update;
    if (timed_out) {
      update = Update(job->command.command_id(), v1::COMMAND_STATE_TIMED_OUT);
      update.set_message("the command ran past its timeout");
    } else if (!cancelled.empty()) {
      update = Update(job->command.command_id(), v1::COMMAND_STATE_CANCELLED);
      update.set_message(cancelled);
    } else if (!result.ok()) {
      update = Update(job->command.command_id(), v1::COMMAND_STATE_FAILED);
      update.set_code(v1::COMMAND_CODE_HANDLER_FAILED);
      update.set_message(std::string(ToStd(result.status().message())));
    } else {
      update = Update(job->command.command_id(), v1::COMMAND_STATE_SUCCEEDED);
      update.set_result(*result);
    }
    Finish(*job, update);
    lock.lock();
    lane->running_keys.erase(job->lane_key);
    cv_.notify_all();  // a job of this key may wait for it
  }
}

void Dispatcher::Watch() {
  UniqueLock lock(mu_);
  while (!stopping_) {
    Clock::time_point next = Clock::time_point::max();
    Clock::time_point now = Clock::now();
    for (auto& [id, job] : active_) {
      if (!job->running || job->timed_out) continue;
      if (job->deadline <= now) {
        job->timed_out = true;
        job->stop = true;
      } else {
        next = std::min(next, job->deadline);
      }
    }
    if (next == Clock::time_point::max()) {
      cv_.wait(lock);
    } else {
      cv_.wait_until(lock, next);
    }
  }
}

}  // namespace bcd
