#pragma once

// node.reboot: the handler and the scheduler behind it.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/log.h"
#include "base/mutex.h"
#include "bettercompute/agent/v1/commands.pb.h"
#include "daemon/dispatch/dispatcher.h"

namespace bcd {

class SessionEngine;

// Waits out a reboot's delay, then for its result to reach the gateway (at most `result_wait`,
// then it reboots anyway and the result goes from the outbox after the restart), then runs the
// reboot command with the reason and the command id in BCD_REBOOT_REASON and BCD_COMMAND_ID. One
// reboot at a time: while one is due, another request is that one. Stop() (or the session
// stopping) abandons a reboot that has not run: a daemon on its way out reboots nothing.
class RebootScheduler {
 public:
  RebootScheduler(std::vector<std::string> command, std::chrono::milliseconds result_wait,
                  SessionEngine* engine, UnixClock now, Logger* log)
      : command_(std::move(command)),
        result_wait_(result_wait),
        engine_(engine),
        now_(std::move(now)),
        log_(log) {}
  ~RebootScheduler() { Stop(); }
  // The unix time the reboot is due.
  int64_t Schedule(std::chrono::seconds delay, std::string reason, std::string command_id);
  void Stop();

 private:
  void Wait(std::chrono::seconds delay, const std::string& reason, const std::string& command_id);

  const std::vector<std::string> command_;
  const std::chrono::milliseconds result_wait_;
  SessionEngine* engine_;
  UnixClock now_;
  Logger* log_;
  Mutex mu_;
  CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<int64_t> due_ ABSL_GUARDED_BY(mu_);  // set while a reboot waits
  std::thread thread_ ABSL_GUARDED_BY(mu_);
};

// node.reboot: hands the delay to the scheduler and answers with the time the reboot is due (an
// earlier reboot still due is the one that happens: the node reboots once).
class NodeRebootHandler final : public TypedHandler<bettercompute::agent::v1::NodeRebootPayload,
                                                    bettercompute::agent::v1::NodeRebootResult> {
 public:
  using Schedule = std::function<int64_t(std::chrono::seconds delay, std::string reason,
                                         std::string command_id)>;
  explicit NodeRebootHandler(Schedule schedule) : schedule_(std::move(schedule)) {}
  absl::Status Check(const bettercompute::agent::v1::Command& command,
                     const bettercompute::agent::v1::NodeRebootPayload& payload) const override;
  absl::StatusOr<bettercompute::agent::v1::NodeRebootResult> Execute(
      const bettercompute::agent::v1::Command& command,
      const bettercompute::agent::v1::NodeRebootPayload& payload,
      const std::atomic<bool>& stop) override;

 private:
  Schedule schedule_;
};

}  // namespace bcd
