#include "modes/node/reboot.h"

#include "base/mutex.h"
#include "base/subprocess.h"
#include "daemon/session/session.h"
#include "fmt/format.h"
#include "proto/absl_compat.h"

namespace bcd {

namespace v1 = bettercompute::agent::v1;

int64_t RebootScheduler::Schedule(std::chrono::seconds delay, std::string reason,
                                  std::string command_id) {
  MutexLock lock(mu_);
  if (due_) return *due_;  // one is due: the node reboots once
  int64_t due = now_() + delay.count();
  if (stopping_) return due;
  if (thread_.joinable()) thread_.join();  // an earlier one ran: this is a new reboot
  due_ = due;
  thread_ = std::thread([this, delay, reason = std::move(reason),
                         command_id = std::move(command_id)] { Wait(delay, reason, command_id); });
  return due;
}

void RebootScheduler::Wait(std::chrono::seconds delay, const std::string& reason,
                           const std::string& command_id) {
  auto abandon = [&](std::string_view why) {
    log_->Warn("node.reboot_abandoned", {{"reason", reason}, {"why", std::string(why)}});
    MutexLock lock(mu_);
    due_.reset();
  };
  auto due_at = std::chrono::steady_clock::now() + delay;
  {
    UniqueLock lock(mu_);
    if (cv_.wait_until(lock, due_at,
                       [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; })) {
      lock.unlock();
      return abandon("bcd stopped before the reboot was due");
    }
  }
  // The result should reach the gateway before the node goes down; after result_wait_ it reboots
  // anyway. A daemon that stops meanwhile does not reboot the machine on its way out.
  auto drained = [](const SessionSnapshot& s) {
    return s.outbox_pending == 0 || s.state == "stopped";
  };
  engine_->WaitUntil(drained, result_wait_);
  bool stopped;
  {
    MutexLock lock(mu_);
    stopped = stopping_ || engine_->Snapshot().state == "stopped";
    if (!stopped) due_.reset();  // from here a new request is a new reboot
  }
  if (stopped) return abandon("bcd stopped before the reboot command ran");
  log_->Warn("node.reboot", {{"reason", reason}, {"command", command_.front()}});
  absl::StatusOr<std::string> ran =
      RunWithEnv(command_, {"BCD_REBOOT_REASON=" + reason, "BCD_COMMAND_ID=" + command_id},
                 std::chrono::minutes(1));
  if (!ran.ok()) {
    std::string why(ToStd(ran.status().message()));
    log_->Error("node.reboot_failed", {{"error", why}});
    (void)engine_->Emit(v1::SEVERITY_ERROR, "node.reboot_failed",
                        "the reboot command failed: " + why);
  }
}

void RebootScheduler::Stop() {
  std::thread thread;
  {
    MutexLock lock(mu_);
    stopping_ = true;
    thread = std::move(thread_);
  }
  cv_.notify_all();
  if (thread.joinable()) thread.join();
}

absl::Status NodeRebootHandler::Check(const v1::Command&,
                                      const v1::NodeRebootPayload& payload) const {
  if (payload.delay_seconds() > 3600) {
    return absl::InvalidArgumentError(
        fmt::format("delay_seconds {} is over an hour", payload.delay_seconds()));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::NodeRebootResult> NodeRebootHandler::Execute(
    const v1::Command& command, const v1::NodeRebootPayload& payload, const std::atomic<bool>&) {
  v1::NodeRebootResult result;
  result.set_scheduled_at(static_cast<uint64_t>(schedule_(
      std::chrono::seconds(payload.delay_seconds()), payload.reason(), command.command_id())));
  return result;
}

}  // namespace bcd
