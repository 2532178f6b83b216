#include "daemon/liveness.h"

#include "fmt/format.h"

namespace bcd {

Liveness::Liveness(std::function<void()> probe, std::chrono::milliseconds period)
    : probe_(std::move(probe)),
      period_(period),
      last_answer_(Clock::now().time_since_epoch().count()) {
  thread_ = std::thread([this] { Loop(); });
}

Liveness::~Liveness() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Liveness::Loop() {
  UniqueLock lock(mu_);
  while (!stopping_) {
    lock.unlock();
    probe_();
    last_answer_ = Clock::now().time_since_epoch().count();
    lock.lock();
    cv_.wait_for(lock, period_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; });
  }
}

absl::Status Liveness::Check() const {
  auto since = Clock::now() - Clock::time_point(Clock::duration(last_answer_.load()));
  if (since < kStale * period_) return absl::OkStatus();
  return absl::UnavailableError(fmt::format(
      "the engine has not answered for {} ms (a thread holds a lock it shares with the others)",
      std::chrono::duration_cast<std::chrono::milliseconds>(since).count()));
}

}  // namespace bcd
