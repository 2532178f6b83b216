#pragma once

// daemon.upgrade: the handler (verify, download, run, swap, hand over to the new version) and what
// a starting daemon does about an upgrade under way (Resume: the trial of the new version, its
// confirmation on the gateway's Welcome, or the report of a rollback). trial.h says how the files
// move and why every step survives `kill -9`.
//
// The restart: the daemon stops its session and re-executes the installed binary in place (the
// same PID, so systemd's Type=notify unit with NotifyAccess=main follows it and a foreground run
// or the ramdisk's init keep their child), with a guard process running the previous binary
// beside it (RunGuard). The command stays running across the restart; its terminal update is
// sent by whichever version runs afterwards.

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "base/log.h"
#include "base/mutex.h"
#include "bettercompute/agent/v1/commands.pb.h"
#include "config/config.h"
#include "daemon/dispatch/dispatcher.h"
#include "daemon/upgrade/trial.h"
#include "transport/http_client.h"

namespace bcd::upgrade {

struct UpgraderOptions {
  Layout layout;  // layout.binary empty: the running binary is unknown and nothing is upgraded
  std::vector<ReleaseKey> pins;
  std::string os_arch;
  std::string running;  // this binary's version
  Config::Update limits;
  std::function<absl::StatusOr<Downloaded>(const DownloadRequest&)> download;
  // Bytes free to an unprivileged writer on the filesystem holding `path` (statvfs by default).
  std::function<absl::StatusOr<uint64_t>(const std::filesystem::path&)> free_bytes;
  UnixClock now;
  Logger* log = nullptr;
  // Stops the daemon so that it re-executes `binary` with `argv` (empty: this process's own), with
  // the guard beside it when `guard`.
  std::function<void(bool guard, const std::filesystem::path& binary,
                     const std::vector<std::string>& argv)>
      restart;
  // An event for the gateway: severity, kind, message, attributes.
  std::function<void(bettercompute::agent::v1::Severity, const std::string&, const std::string&,
                     const std::map<std::string, std::string>&)>
      event;
  // Concludes the command a previous process left running (Dispatcher::Resolve).
  std::function<void(const bettercompute::agent::v1::CommandUpdate&)> resolve;
  // Blocks until a session is welcomed (true), `timeout` passes or the daemon stops (false); the
  // session's last error, for the reason of a rollback.
  std::function<bool(std::chrono::milliseconds timeout)> welcomed;
  std::function<std::string()> last_error;
  std::vector<std::string> argv;  // this process's command line, kept for a rollback
};

class Upgrader final : public TypedHandler<bettercompute::agent::v1::DaemonUpgradePayload,
                                           bettercompute::agent::v1::DaemonUpgradeResult> {
 public:
  explicit Upgrader(UpgraderOptions options);
  ~Upgrader() override;

  // Refused UNSUPPORTED without pinned release keys: the binary must then be replaced by hand.
  absl::Status Check(const bettercompute::agent::v1::Command& command,
                     const bettercompute::agent::v1::DaemonUpgradePayload& payload) const override;
  absl::StatusOr<bettercompute::agent::v1::DaemonUpgradeResult> Execute(
      const bettercompute::agent::v1::Command& command,
      const bettercompute::agent::v1::DaemonUpgradePayload& payload,
      const std::atomic<bool>& stop) override;

  // What the starting daemon does, before it reports interrupted commands and dials.
  struct Resumed {
    std::optional<std::string> claimed;  // a command it reports itself: not "interrupted"
    bool restart = false;                // rolled back: re-execute now, do not dial
    std::filesystem::path binary;        // this binary
    std::vector<std::string> argv;       // with this command line
  };
  absl::StatusOr<Resumed> Resume();
  // Ends the trial's wait (the daemon stops).
  void Stop();

 private:
  // The new version's trial: waits for the Welcome, then confirms or rolls back.
  void Watch(Trial trial);
  // The layout of `trial`: the binary it swapped, which a new version run through a wrapper does
  // not run from.
  Layout LayoutOf(const Trial& trial) const;
  void Confirm(Trial trial);
  // Sends the terminal update of a finished upgrade and forgets the marker.
  void Report(const Trial& trial, bool succeeded, const std::string& message);

  UpgraderOptions o_;
  std::atomic<bool> stopping_{false};
  std::thread watch_;
};

}  // namespace bcd::upgrade
