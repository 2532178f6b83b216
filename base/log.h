#pragma once

// Structured log lines on a stream (stderr under systemd, where journald keeps them), in logfmt
//   level=info event=session.welcome session_id=s-1 version=1
// (values with spaces, quotes or '=' are quoted) or, with log_format = "json", one JSON object a
// line
//   {"level":"info","event":"session.welcome","session_id":"s-1","version":"1"}
// (every value a string; bytes that are not UTF-8 become U+FFFD). Never pass a secret, key or
// token as a value. Every event name is listed, with what it means, in docs/operations.md.
//
// Warnings and errors are limited per event: at most kBurst lines of one event a minute; the rest
// are counted, and the next line of that event after the minute says how many were left out
// (suppressed=N). Whatever a peer keeps sending, the journal grows by a bounded amount.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <mutex>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

#include "base/mutex.h"

namespace bcd {

enum class LogLevel { kDebug, kInfo, kWarn, kError };
enum class LogFormat { kLogfmt, kJson };
std::string_view LogLevelName(LogLevel level);

class Logger {
 public:
  static constexpr int kBurst = 20;
  static constexpr std::chrono::seconds kWindow{60};

  Logger(std::ostream* out, LogLevel level) : out_(out), level_(level) {}
  // The clock of the per-event limit (tests step it).
  void set_clock(std::function<std::chrono::steady_clock::time_point()> clock) {
    MutexLock lock(mu_);
    clock_ = std::move(clock);
  }
  void set_level(LogLevel level) { level_ = level; }
  void set_format(LogFormat format) { format_ = format; }
  // Under journald: each line starts with its syslog priority ("<6>" for info), which journald
  // strips and keeps as the entry's level (journalctl -p warning shows warnings and errors).
  void set_priority_prefix(bool on) { priority_prefix_ = on; }
  // What was logged so far when the stream is a std::ostringstream, else "": for tests that read
  // the log while other threads write to it.
  std::string Text();
  LogLevel level() const { return level_; }
  void Log(LogLevel level, std::string_view event,
           std::initializer_list<std::pair<std::string_view, std::string>> fields = {});
  void Info(std::string_view event,
            std::initializer_list<std::pair<std::string_view, std::string>> fields = {}) {
    Log(LogLevel::kInfo, event, fields);
  }
  void Warn(std::string_view event,
            std::initializer_list<std::pair<std::string_view, std::string>> fields = {}) {
    Log(LogLevel::kWarn, event, fields);
  }
  void Error(std::string_view event,
             std::initializer_list<std::pair<std::string_view, std::string>> fields = {}) {
    Log(LogLevel::kError, event, fields);
  }

 private:
  struct Window {
    std::chrono::steady_clock::time_point start;
    int lines = 0;
    uint64_t suppressed = 0;
  };
  Mutex mu_;
  std::ostream* const out_;  // set once; written to holding mu_
  std::function<std::chrono::steady_clock::time_point()> clock_ ABSL_GUARDED_BY(mu_) =
      std::chrono::steady_clock::now;
  std::map<std::string, Window, std::less<>> windows_
      ABSL_GUARDED_BY(mu_);  // warn and error events
  std::atomic<LogLevel> level_;
  std::atomic<bool> priority_prefix_{false};
  std::atomic<LogFormat> format_{LogFormat::kLogfmt};
};

}  // namespace bcd
