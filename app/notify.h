#pragma once

// The systemd service protocol (sd_notify(3)) without libsystemd: datagrams of "KEY=VALUE" lines to
// the unix socket $NOTIFY_SOCKET names (a path, or "@name" in the abstract namespace). READY=1 once
// the first session is up (or after a bounded wait), WATCHDOG=1 every half of $WATCHDOG_USEC while
// the session engine answers, STOPPING=1 on the way out. Does nothing outside systemd.

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace bcd {

class SystemdNotifier {
 public:
  // From $NOTIFY_SOCKET, $WATCHDOG_USEC and $WATCHDOG_PID (through `env`); nullopt when systemd
  // did not ask for notifications.
  static std::optional<SystemdNotifier> FromEnvironment(
      const std::function<std::optional<std::string>(const char*)>& env);
  // Sends one datagram; false when it could not.
  bool Notify(std::string_view state) const;
  // How often to send WATCHDOG=1 (half the watchdog timeout), when systemd watches this process.
  std::optional<std::chrono::microseconds> watchdog_interval() const { return watchdog_; }

 private:
  std::string socket_;
  std::optional<std::chrono::microseconds> watchdog_;
};

// Whether `fd` is the journal stream systemd connected ($JOURNAL_STREAM holds its "device:inode",
// sd-daemon(3)): lines written there can carry a "<N>" priority prefix that journald turns into
// the entry's level.
bool IsJournalStream(int fd, const std::function<std::optional<std::string>(const char*)>& env);

}  // namespace bcd
