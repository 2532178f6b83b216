#pragma once

// The one liveness check of a daemon, which the systemd watchdog and /healthz both read: a thread
// of its own runs `probe` (which takes every lock the engine's threads share) once a period and
// notes when it returned. The daemon is alive while the last probe returned less than kStale
// periods ago; a lock held forever stalls the probe, and the check then says for how long nothing
// has answered. Reading the check never blocks.

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>

#include "absl/status/status.h"
#include "base/mutex.h"

namespace bcd {

class Liveness {
 public:
  static constexpr int kStale = 3;
  using Clock = std::chrono::steady_clock;

  Liveness(std::function<void()> probe, std::chrono::milliseconds period);
  ~Liveness();
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;

  // OK while the last probe returned within kStale periods; Unavailable saying how long ago
  // otherwise.
  absl::Status Check() const;
  std::chrono::milliseconds period() const { return period_; }

 private:
  void Loop();

  std::function<void()> probe_;
  const std::chrono::milliseconds period_;
  std::atomic<Clock::rep> last_answer_;  // Clock ticks of the last probe's return
  Mutex mu_;
  CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace bcd
