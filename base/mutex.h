#pragma once

// The mutex, its scoped locks and the condition variable bcd uses, annotated for clang's thread
// safety analysis (-Wthread-safety, on in the clang build): a member written
//   int count_ ABSL_GUARDED_BY(mu_);
// may only be touched holding mu_, and a function marked ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) only
// called holding it; the compiler checks both. Thin wrappers over std::mutex and
// std::condition_variable, which libstdc++ does not annotate.
//
// A predicate handed to CondVar::wait reads guarded state while the lock is held, which the
// analysis cannot see through the standard library: mark the lambda
//   [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; }
//
// Lock order, where two locks nest, is written beside the second lock's declaration.

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace bcd {

class ABSL_LOCKABLE Mutex {
 public:
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  friend class UniqueLock;
  std::mutex mu_;
};

// Holds `mu` for its scope (std::lock_guard).
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

// Holds `mu` for its scope, but may let it go and take it again, and waits on a CondVar
// (std::unique_lock).
class ABSL_SCOPED_LOCKABLE UniqueLock {
 public:
  explicit UniqueLock(Mutex& mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : lock_(mu.mu_) {}
  ~UniqueLock() ABSL_UNLOCK_FUNCTION() {}
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { lock_.lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { lock_.unlock(); }

 private:
  friend class CondVar;
  std::unique_lock<std::mutex> lock_;
};

class CondVar {
 public:
  void notify_one() { cv_.notify_one(); }
  void notify_all() { cv_.notify_all(); }
  void wait(UniqueLock& lock) { cv_.wait(lock.lock_); }
  template <class Predicate>
  void wait(UniqueLock& lock, Predicate ready) {
    cv_.wait(lock.lock_, std::move(ready));
  }
  template <class Rep, class Period>
  std::cv_status wait_for(UniqueLock& lock, std::chrono::duration<Rep, Period> timeout) {
    return cv_.wait_for(lock.lock_, timeout);
  }
  template <class Rep, class Period, class Predicate>
  bool wait_for(UniqueLock& lock, std::chrono::duration<Rep, Period> timeout, Predicate ready) {
    return cv_.wait_for(lock.lock_, timeout, std::move(ready));
  }
  template <class Clock, class Duration>
  std::cv_status wait_until(UniqueLock& lock, std::chrono::time_point<Clock, Duration> deadline) {
    return cv_.wait_until(lock.lock_, deadline);
  }
  template <class Clock, class Duration, class Predicate>
  bool wait_until(UniqueLock& lock, std::chrono::time_point<Clock, Duration> deadline,
                  Predicate ready) {
    return cv_.wait_until(lock.lock_, deadline, std::move(ready));
  }

 private:
  std::condition_variable cv_;
};

}  // namespace bcd
