#include "daemon/session/session.h"

#include <thread>

#include "base/backoff.h"
#include "base/mutex.h"
#include "base/version.h"
#include "daemon/dispatch/desired.h"
#include "daemon/dispatch/dispatcher.h"
#include "daemon/secrets/secrets.h"
#include "daemon/tunnels/tunnels.h"
#include "fmt/format.h"
#include "proto/absl_compat.h"

namespace bcd {

namespace v1 = bettercompute::agent::v1;

// The counters of every frame case, bound once: frames move them without a lookup by name.
struct SessionEngine::Figures {
  explicit Figures(Metrics& m)
      : metrics(m),
        dials(m.Counter("bcd_session_dials_total", "Sessions dialed").Bind({})),
        welcomes(m.Counter("bcd_session_welcomes_total", "Sessions the gateway welcomed").Bind({})),
        redials(m.Counter("bcd_session_redials_total",
                          "Redials after a failed dial or an ended session, by reason",
                          {"reason"})),
        up(m.Gauge("bcd_session_up", "1 while a session is welcomed, else 0")),
        upgrade(m.Gauge("bcd_session_upgrade_required",
                        "1 while the gateway says this daemon must be upgraded")),
        trust(m.Gauge("bcd_trust_bundle_version", "The version of the trust bundle enforced")),
        approvers(m.Gauge("bcd_approver_set_epoch", "The epoch of the approver set enforced")) {
    Bind(m.Counter("bcd_frames_received_total", "Frames from the gateway, by case", {"case"}),
         *v1::ServerFrame::descriptor()->FindOneofByName("frame"), &received);
    Bind(m.Counter("bcd_frames_sent_total", "Frames to the gateway, by case", {"case"}),
         *v1::AgentFrame::descriptor()->FindOneofByName("frame"), &sent);
    unknown = m.Counter("bcd_frames_received_total", "Frames from the gateway, by case", {"case"})
                  .Bind({"unknown"});
  }
  static void Bind(CounterFamily& family, const google::protobuf::OneofDescriptor& oneof,
                   std::map<int, Counter>* out) {
    for (int i = 0; i < oneof.field_count(); ++i) {
      (*out)[oneof.field(i)->number()] = family.Bind({oneof.field(i)->name()});
    }
  }
  void Count(const std::map<int, Counter>& counters, int number) const {
    auto it = counters.find(number);
    (it == counters.end() ? unknown : it->second).Add();
  }
  // A reason as a label: the gateway's x-bc-reason token when it is one (letters, digits, '-',
  // at most 40), else the status code.
  static std::string Reason(const transport::Refusal& refusal) {
    bool token = !refusal.reason.empty() && refusal.reason.size() <= 40 &&
                 refusal.reason.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") ==
                     std::string::npos;
    if (token) return refusal.reason;
    if (refusal.code == grpc::StatusCode::OK) return "ended";
    return StatusLabel(absl::Status(static_cast<absl::StatusCode>(refusal.code), ""));
  }

  Metrics& metrics;
  Counter dials, welcomes, unknown;
  CounterFamily& redials;
  GaugeFamily &up, &upgrade, &trust, &approvers;
  std::map<int, Counter> received, sent;  // by frame field number; read-only once built
};

// The session stream, counting the frames that pass by case.
class SessionEngine::CountedStream : public transport::FrameStream {
 public:
  CountedStream(transport::FrameStream& inner, const Figures& figures)
      : inner_(inner), figures_(figures) {}
  bool Read(v1::ServerFrame* frame) override {
    if (!inner_.Read(frame)) return false;
    figures_.Count(figures_.received, frame->frame_case());
    return true;
  }
  bool Write(const v1::AgentFrame& frame) override {
    if (!inner_.Write(frame)) return false;
    figures_.Count(figures_.sent, frame.frame_case());
    return true;
  }
  void CloseSend() override { inner_.CloseSend(); }
  void Cancel() override { inner_.Cancel(); }
  transport::Refusal Finish() override { return inner_.Finish(); }
  absl::StatusOr<std::unique_ptr<transport::TunnelStream>> OpenTunnel() override {
    return inner_.OpenTunnel();
  }

 private:
  transport::FrameStream& inner_;
  const Figures& figures_;
};

SessionEngine::SessionEngine(transport::Transport* transport, pki::TrustState trust,
                             pki::PublicKey join_service_key, SessionOptions options,
                             Outbox* outbox, Logger* log)
    : transport_(transport),
      trust_(std::move(trust)),
      join_service_key_(std::move(join_service_key)),
      options_(std::move(options)),
      log_(log),
      outbox_(outbox) {
  status_interval_ms_ = options_.status_interval.count();
  snapshot_.trust_version = trust_.version();
  snapshot_.outbox_pending = outbox_->pending().size();
  snapshot_.last_acked_seq = outbox_->last_acked();
  if (options_.metrics == nullptr) {
    own_metrics_ = std::make_unique<Metrics>();
    options_.metrics = own_metrics_.get();
  }
  figures_ = std::make_unique<Figures>(*options_.metrics);
  figures_->trust.Set({}, static_cast<double>(trust_.version()));
  figures_->approvers.Set({}, static_cast<double>(trust_.approvers().epoch()));
  figures_->up.Set({}, 0);
  options_.metrics->Collect(
      "bcd_outbox_entries", "Command updates and events waiting for the gateway's Ack",
      MetricType::kGauge, {}, [this] {
        MutexLock lock(outbox_mu_);
        return std::vector<Sample>{{{}, static_cast<double>(outbox_->pending().size())}};
      });
  options_.metrics->Collect(
      "bcd_outbox_oldest_unacked_seconds",
      "Age of the oldest entry the gateway has not acknowledged (0 when none)", MetricType::kGauge,
      {}, [this] {
        uint64_t oldest_ms = 0;
        {
          MutexLock lock(outbox_mu_);
          if (!outbox_->pending().empty()) {
            const v1::AgentFrame& front = outbox_->pending().front();
            oldest_ms =
                front.has_event() ? front.event().time_ms() : front.command_update().time_ms();
          }
        }
        double age = oldest_ms == 0 ? 0
                                    : std::max(0.0, static_cast<double>(options_.now()) -
                                                        static_cast<double>(oldest_ms) / 1000);
        return std::vector<Sample>{{{}, age}};
      });
}

absl::Status SessionEngine::Emit(v1::Severity severity, std::string kind, std::string message,
                                 const std::map<std::string, std::string>& attributes) {
  v1::AgentFrame frame;
  v1::Event* event = frame.mutable_event();
  event->set_kind(std::move(kind));
  event->set_severity(severity);
  event->set_message(std::move(message));
  event->set_time_ms(static_cast<uint64_t>(options_.now()) * 1000);
  for (auto& [key, value] : attributes) (*event->mutable_attributes())[key] = value;
  return Enqueue(std::move(frame), {});
}

absl::Status SessionEngine::EmitUpdate(const v1::CommandUpdate& update,
                                       const std::function<void()>& then) {
  v1::AgentFrame frame;
  *frame.mutable_command_update() = update;
  return Enqueue(std::move(frame), then);
}

bool SessionEngine::Send(const v1::AgentFrame& frame) {
  MutexLock lock(outbox_mu_);
  return live_ != nullptr && live_->Write(frame);
}

absl::Status SessionEngine::Enqueue(v1::AgentFrame frame, const std::function<void()>& then) {
  MutexLock lock(outbox_mu_);
  absl::StatusOr<v1::AgentFrame> stored = outbox_->Append(std::move(frame));
  // Runs before an Ack can drop the entry: see EmitUpdate.
  if (then) then();
  if (!stored.ok()) {
    log_->Warn("outbox.refused", {{"error", std::string(ToStd(stored.status().message()))}});
    if (absl::IsResourceExhausted(stored.status())) {
      // The slot the outbox keeps for this takes it once; later refusals find it used.
      v1::AgentFrame notice;
      v1::Event* event = notice.mutable_event();
      event->set_kind(kOutboxFullEvent);
      event->set_severity(v1::SEVERITY_ERROR);
      event->set_message(std::string(ToStd(stored.status().message())) +
                         ": updates and events after this one are lost until it drains");
      event->set_time_ms(static_cast<uint64_t>(options_.now()) * 1000);
      if (absl::StatusOr<v1::AgentFrame> sent = outbox_->Append(std::move(notice)); sent.ok()) {
        log_->Error("outbox.full", {{"pending", std::to_string(outbox_->pending().size())}});
        if (live_ != nullptr) live_->Write(*sent);
        MutexLock snapshot_lock(mu_);
        snapshot_.outbox_pending = outbox_->pending().size();
      }
    }
    cv_.notify_all();
    return stored.status();
  }
  if (live_ != nullptr) live_->Write(*stored);
  MutexLock snapshot_lock(mu_);
  snapshot_.outbox_pending = outbox_->pending().size();
  return absl::OkStatus();
}

SessionEngine::~SessionEngine() {
  options_.metrics->Forget("bcd_outbox_entries");
  options_.metrics->Forget("bcd_outbox_oldest_unacked_seconds");
}

void SessionEngine::SetState(std::string state, std::string error) {
  {
    MutexLock lock(mu_);
    snapshot_.state = std::move(state);
    if (!error.empty()) snapshot_.last_error = std::move(error);
  }
  cv_.notify_all();
}

bool SessionEngine::WaitUntil(const std::function<bool(const SessionSnapshot&)>& done,
                              std::chrono::milliseconds timeout) const {
  UniqueLock lock(mu_);
  return cv_.wait_for(lock, timeout,
                      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done(snapshot_); });
}

SessionSnapshot SessionEngine::Snapshot() const {
  MutexLock lock(mu_);
  return snapshot_;
}

v1::AgentFrame SessionEngine::Hello() const {
  v1::AgentFrame frame;
  v1::Hello* hello = frame.mutable_hello();
  hello->set_proto_min(options_.range.min());
  hello->set_proto_max(options_.range.max());
  hello->set_daemon_version(std::string(Version()));
  for (const std::string& capability : options_.capabilities) hello->add_capabilities(capability);
  hello->set_role(options_.role);
  hello->set_trust_version(trust_.version());
  if (desired_ != nullptr) hello->set_applied_generation(desired_->applied_generation());
  {
    MutexLock lock(outbox_mu_);
    hello->set_last_acked_seq(outbox_->last_acked());
  }
  hello->set_boot_id(options_.boot_id);
  hello->set_started_at(static_cast<uint64_t>(options_.started_at));
  hello->set_approver_set_epoch(trust_.approvers().epoch());
  hello->set_approver_set_sha256(trust_.approvers().Sha256());
  return frame;
}

v1::AgentFrame SessionEngine::Status() const {
  v1::AgentFrame frame;
  v1::StatusReport* status = frame.mutable_status();
  status->set_uptime(
      static_cast<uint64_t>(std::max<int64_t>(0, options_.now() - options_.started_at)));
  status->set_trust_version(trust_.version());
  if (desired_ != nullptr) {
    status->set_applied_generation(desired_->applied_generation());
    for (const v1::SectionStatus& section : desired_->sections()) *status->add_sections() = section;
  }
  status->set_certificate_not_after(static_cast<uint64_t>(options_.certificate_not_after));
  status->set_daemon_version(std::string(Version()));
  {
    MutexLock lock(outbox_mu_);
    status->set_outbox_pending(outbox_->pending().size());
  }
  status->set_approver_set_epoch(trust_.approvers().epoch());
  status->set_approver_set_sha256(trust_.approvers().Sha256());
  return frame;
}

bool SessionEngine::ApplyTrust(const v1::SignedTrustBundle& bundle) {
  absl::StatusOr<pki::TrustState::Update> update = trust_.Accept(bundle, join_service_key_);
  if (!update.ok()) {
    log_->Warn("trust.refused", {{"reason", std::string(ToStd(update.status().message()))}});
    return false;
  }
  trust_ = update->state;
  if (!update->approver_set_refusal.empty()) {
    log_->Warn("trust.approver_set_refused", {{"reason", update->approver_set_refusal}});
    (void)Emit(v1::SEVERITY_WARNING, "trust.approver_set_refused", update->approver_set_refusal);
  }
  // What is enforced now is what a restart enforces: the new bundle, with the held approver set
  // when its change was refused.
  if (options_.on_trust) options_.on_trust(trust_);
  {
    MutexLock lock(mu_);
    snapshot_.trust_version = trust_.version();
  }
  figures_->trust.Set({}, static_cast<double>(trust_.version()));
  figures_->approvers.Set({}, static_cast<double>(trust_.approvers().epoch()));
  log_->Info("trust.updated", {{"version", std::to_string(trust_.version())}});
  (void)Emit(v1::SEVERITY_INFO, "trust.updated", "a newer trust bundle was taken",
             {{"version", std::to_string(trust_.version())}});
  return true;
}

bool SessionEngine::Handle(const v1::ServerFrame& frame) {
  auto unhandled = [&] {
    // Tunnels arrive with their own work; the other cases need their handler set.
    MutexLock lock(mu_);
    ++snapshot_.unhandled_frames;
    return false;
  };
  switch (frame.frame_case()) {
    case v1::ServerFrame::kTrust:
      return ApplyTrust(frame.trust());
    case v1::ServerFrame::kCommand:
      if (dispatcher_ == nullptr) return unhandled();
      dispatcher_->Submit(frame.command(), trust_, Snapshot().upgrade_required,
                          options_.signed_only);
      return false;
    case v1::ServerFrame::kCancelCommand:
      if (dispatcher_ == nullptr) return unhandled();
      dispatcher_->Cancel(frame.cancel_command().command_id(), frame.cancel_command().reason());
      return false;
    case v1::ServerFrame::kDesiredState: {
      if (desired_ == nullptr) return unhandled();
      v1::AgentFrame reply;
      *reply.mutable_spec_ack() =
          desired_->Offer(frame.desired_state(), trust_, options_.now(), options_.signed_only);
      bool applied = reply.spec_ack().state() == v1::SPEC_ACK_STATE_APPLIED;
      Send(reply);
      return applied;
    }
    case v1::ServerFrame::kSecretResponse:
      if (secrets_ == nullptr) return unhandled();
      secrets_->OnSecretResponse(frame.secret_response());
      return false;
    case v1::ServerFrame::kWorkloadTokenResponse:
      if (secrets_ == nullptr) return unhandled();
      secrets_->OnWorkloadTokenResponse(frame.workload_token_response());
      return false;
    case v1::ServerFrame::kAck: {
      MutexLock lock(outbox_mu_);
      if (absl::Status s = outbox_->Ack(frame.ack().up_to_seq()); !s.ok()) {
        log_->Warn("outbox.ack_failed", {{"error", std::string(ToStd(s.message()))}});
      }
      MutexLock snapshot_lock(mu_);
      snapshot_.outbox_pending = outbox_->pending().size();
      snapshot_.last_acked_seq = outbox_->last_acked();
      cv_.notify_all();
      return false;
    }
    case v1::ServerFrame::kOpenTunnel:
      if (!options_.tunnels) {
        log_->Warn("tunnel.refused", {{"tunnel_id", frame.open_tunnel().tunnel_id()},
                                      {"reason", "tunnels need the gRPC transport"}});
        (void)Emit(v1::SEVERITY_WARNING, "tunnel.refused",
                   "tunnels need the gRPC transport; this session is a WebSocket",
                   {{"tunnel_id", frame.open_tunnel().tunnel_id()}});
        return unhandled();
      }
      {
        transport::FrameStream* session;
        {
          MutexLock lock(outbox_mu_);
          session = live_;  // the stream this frame came on (Handle runs on its reading thread)
        }
        if (tunnels_ == nullptr || session == nullptr) return unhandled();
        // A refusal is logged and reported by the runner; the gateway's open times out.
        (void)tunnels_->Open(frame.open_tunnel(), *session, Snapshot().session_id);
        return false;
      }
    case v1::ServerFrame::FRAME_NOT_SET: {
      MutexLock lock(mu_);
      ++snapshot_.unknown_frames;
      return false;
    }
    default:
      return unhandled();
  }
}

bool SessionEngine::ReadFirst(transport::FrameStream& stream, v1::ServerFrame* first, bool* late) {
  // A gateway that never answers Hello must not hold the session: past the timeout the stream is
  // cancelled, which ends the Read below.
  Mutex mu;
  CondVar cv;
  bool answered = false;
  std::thread watch([&] {
    UniqueLock lock(mu);
    if (!cv.wait_for(lock, options_.welcome_timeout, [&] { return answered; })) {
      *late = true;
      stream.Cancel();
    }
  });
  bool read = stream.Read(first);
  {
    MutexLock lock(mu);
    answered = true;
  }
  cv.notify_all();
  watch.join();
  return read;
}

void SessionEngine::Welcomed(transport::FrameStream& stream, const v1::Welcome& welcome) {
  {
    MutexLock lock(mu_);
    snapshot_.state = "connected";
    snapshot_.session_id = welcome.session_id();
    snapshot_.protocol_version = welcome.protocol_version();
    snapshot_.upgrade_required = welcome.upgrade_required();
    ++snapshot_.welcomes;
  }
  cv_.notify_all();
  figures_->welcomes.Add();
  figures_->up.Set({}, 1);
  figures_->upgrade.Set({}, welcome.upgrade_required() ? 1 : 0);
  log_->Info("session.welcome",
             {{"session_id", welcome.session_id()},
              {"version", std::to_string(welcome.protocol_version())},
              {"upgrade_required", welcome.upgrade_required() ? "true" : "false"}});
  {
    // What the gateway has not acknowledged goes again, in order, before anything new.
    MutexLock lock(outbox_mu_);
    for (const v1::AgentFrame& pending : outbox_->pending()) stream.Write(pending);
    live_ = &stream;
  }
  if (secrets_ != nullptr) secrets_->SessionUp(Snapshot().welcomes);
  if (welcome.has_trust()) ApplyTrust(welcome.trust());
  stream.Write(Status());
}

void SessionEngine::Converse(transport::FrameStream& stream) {
  // The periodic StatusReport, until this connection ends.
  Mutex ticker_mu;
  CondVar ticker_cv;
  bool ended = false;
  std::thread ticker([&] {
    UniqueLock lock(ticker_mu);
    while (!ticker_cv.wait_for(lock, std::chrono::milliseconds(status_interval_ms_.load()),
                               [&] { return ended; })) {
      lock.unlock();
      stream.Write(Status());
      lock.lock();
    }
  });
  v1::ServerFrame frame;
  while (stream.Read(&frame)) {
    if (Handle(frame)) stream.Write(Status());  // StatusReport on change
  }
  if (tunnels_ != nullptr) tunnels_->CloseAll();  // a tunnel lives no longer than its session
  {
    MutexLock lock(ticker_mu);
    ended = true;
  }
  ticker_cv.notify_all();
  ticker.join();
  {
    MutexLock lock(outbox_mu_);
    live_ = nullptr;
  }
  if (secrets_ != nullptr) secrets_->SessionDown();  // waits on this session fail now
  figures_->up.Set({}, 0);
}

transport::Refusal SessionEngine::Serve(transport::FrameStream& stream, Backoff& backoff) {
  auto fail = [&](std::string why) {
    stream.Cancel();
    transport::Refusal refusal = stream.Finish();
    refusal.message = std::move(why);
    refusal.reason = "protocol-error";
    return refusal;
  };
  if (!stream.Write(Hello())) return stream.Finish();
  v1::ServerFrame first;
  bool late = false;
  bool read = ReadFirst(stream, &first, &late);
  if (late) {
    return fail(fmt::format(
        "no Welcome within {} s of the session's start",
        std::chrono::duration_cast<std::chrono::seconds>(options_.welcome_timeout).count()));
  }
  if (!read) return stream.Finish();
  if (!first.has_welcome()) return fail("the gateway's first frame was not Welcome");
  const v1::Welcome& welcome = first.welcome();
  if (absl::Status s = proto::CheckWelcomeVersion(options_.range, welcome.protocol_version(),
                                                  welcome.upgrade_required());
      !s.ok()) {
    return fail(std::string(ToStd(s.message())));
  }
  backoff.Reset();
  Welcomed(stream, welcome);
  Converse(stream);
  return stream.Finish();
}

absl::Status SessionEngine::Run() {
  Backoff backoff(options_.uniform01);
  // Failures in a row: the first few are warnings; a storm of them is said once, then logged at
  // debug until a session is welcomed again.
  constexpr int kLoudFailures = 5;
  int failures = 0;
  auto failed = [&](std::string_view event,
                    std::initializer_list<std::pair<std::string_view, std::string>> fields) {
    ++failures;
    log_->Log(failures <= kLoudFailures ? LogLevel::kWarn : LogLevel::kDebug, event, fields);
    if (failures == kLoudFailures) {
      log_->Warn("session.redialing",
                 {{"failures", std::to_string(failures)},
                  {"note",
                   "the gateway keeps failing; further failures are logged at debug "
                   "until a session is welcomed"}});
    }
  };
  while (true) {
    int welcomes_before;
    {
      MutexLock lock(mu_);
      if (stopping_) break;
      snapshot_.state = "connecting";
      snapshot_.session_id.clear();  // the last session's id is not this one's
      snapshot_.protocol_version = 0;
      welcomes_before = snapshot_.welcomes;
    }
    cv_.notify_all();
    std::chrono::milliseconds delay{0};
    figures_->dials.Add();
    absl::StatusOr<std::unique_ptr<transport::FrameStream>> stream = transport_->OpenSession();
    if (!stream.ok()) {
      figures_->redials.Add({"dial_failed"});
      SetState("backoff", std::string(ToStd(stream.status().message())));
      delay = backoff.Next();
      failed("session.dial_failed", {{"error", std::string(ToStd(stream.status().message()))},
                                     {"retry_ms", std::to_string(delay.count())}});
    } else {
      CountedStream counted(**stream, *figures_);
      {
        MutexLock lock(mu_);
        current_ = &counted;
        if (stopping_) counted.CloseSend();
      }
      transport::Refusal refusal = Serve(counted, backoff);
      {
        MutexLock lock(mu_);
        current_ = nullptr;
        if (stopping_) break;
      }
      cv_.notify_all();
      std::string error = refusal.code == grpc::StatusCode::OK ? "the gateway ended the session"
                                                               : refusal.ToString();
      SetState("backoff", error);
      if (Snapshot().welcomes > welcomes_before) failures = 0;
      if (refusal.NeedsPerson()) {
        log_->Error("session.ended", {{"reason", refusal.reason}, {"error", error}});
        SetState("stopped");
        return absl::FailedPreconditionError("the gateway " + refusal.ToString() +
                                             "; a person must act");
      }
      delay = refusal.pushback ? backoff.After(*refusal.pushback) : backoff.Next();
      figures_->redials.Add({Figures::Reason(refusal)});
      failed("session.ended", {{"reason", refusal.reason},
                               {"error", error},
                               {"retry_ms", std::to_string(delay.count())}});
    }
    UniqueLock lock(mu_);
    cv_.wait_for(lock, delay, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; });
  }
  {
    MutexLock lock(mu_);
    snapshot_.state = "stopped";
    current_ = nullptr;
  }
  cv_.notify_all();
  log_->Info("session.stopped");
  return absl::OkStatus();
}

void SessionEngine::Stop() {
  UniqueLock lock(mu_);
  stopping_ = true;
  if (current_ != nullptr) current_->CloseSend();
  cv_.notify_all();
  if (!cv_.wait_for(lock, std::chrono::seconds(2),
                    [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return current_ == nullptr; })) {
    current_->Cancel();
  }
}

}  // namespace bcd
