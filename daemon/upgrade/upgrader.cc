#include "daemon/upgrade/upgrader.h"

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "absl/strings/escaping.h"
#include "base/files.h"
#include "base/subprocess.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "proto/absl_compat.h"

namespace bcd::upgrade {

namespace v1 = bettercompute::agent::v1;

namespace {

absl::StatusOr<uint64_t> StatvfsFree(const std::filesystem::path& path) {
  struct statvfs fs {};
  if (statvfs(path.c_str(), &fs) != 0) return ErrnoStatus("cannot statvfs", path);
  return static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
}

// The same status with `what` in front of its message.
absl::Status Prefixed(const absl::Status& status, std::string_view what) {
  return absl::Status(status.code(), fmt::format("{}: {}", what, ToStd(status.message())));
}

}  // namespace

Upgrader::Upgrader(UpgraderOptions options) : o_(std::move(options)) {
  if (!o_.free_bytes) o_.free_bytes = StatvfsFree;
}

Upgrader::~Upgrader() { Stop(); }

void Upgrader::Stop() {
  stopping_ = true;
  if (watch_.joinable()) watch_.join();
}

absl::Status Upgrader::Check(const v1::Command& command,
                             const v1::DaemonUpgradePayload& payload) const {
  (void)command;
  (void)payload;
  if (o_.pins.empty()) {
    return absl::UnimplementedError(
        "no release keys are pinned ([update] release_keys): this node takes no daemon.upgrade, "
        "and its binary must be replaced by hand");
  }
  if (o_.layout.binary.empty()) {
    return absl::UnimplementedError(
        "the path of the running binary is unknown: this daemon cannot replace itself");
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::DaemonUpgradeResult> Upgrader::Execute(const v1::Command& command,
                                                          const v1::DaemonUpgradePayload& payload,
                                                          const std::atomic<bool>& stop) {
  const Layout& layout = o_.layout;
  // 1. The release, before anything changes.
  absl::StatusOr<std::optional<Semver>> highest = ReadHighest(layout);
  if (!highest.ok()) return Prefixed(highest.status(), "verification");
  ReleasePolicy policy{.pins = o_.pins,
                       .os_arch = o_.os_arch,
                       .running = o_.running,
                       .highest = *highest,
                       .read_file = [](const std::filesystem::path& path) {
                         return ReadWholeFile(path, 64 * 1024);
                       }};
  if (absl::Status s = VerifyRelease(payload, policy); !s.ok()) return Prefixed(s, "verification");

  // 2. The download, beside the binary, checked while it streams.
  std::filesystem::path staged = layout.download();
  auto discard = [&](absl::Status status) {
    unlink(staged.c_str());
    return status;
  };
  uint64_t keep_free = static_cast<uint64_t>(o_.limits.keep_free_bytes);
  absl::StatusOr<Downloaded> got = o_.download(
      DownloadRequest{.url = payload.url(),
                      .file = staged,
                      .max_bytes = static_cast<uint64_t>(o_.limits.max_bytes),
                      .on_length = [&](std::optional<uint64_t> length) -> absl::Status {
                        absl::StatusOr<uint64_t> free = o_.free_bytes(staged.parent_path());
                        if (!free.ok()) return free.status();
                        uint64_t need = length.value_or(0) + keep_free;
                        if (*free < need) {
                          return absl::ResourceExhaustedError(fmt::format(
                              "{} has {} bytes free: the release needs {}{} and {} must stay free",
                              staged.parent_path().string(), *free, length.value_or(0),
                              length ? "" : " (its size was not sent)", keep_free));
                        }
                        return absl::OkStatus();
                      },
                      .timeout = std::chrono::minutes(8),
                      .stop = &stop});
  if (!got.ok()) return discard(Prefixed(got.status(), "download"));
  if (got->sha256 != payload.sha256()) {
    return discard(absl::DataLossError(
        fmt::format("download: the {} bytes from {} have sha256 {}, the release says {}",
                    got->bytes, payload.url(), absl::BytesToHexString(got->sha256),
                    absl::BytesToHexString(payload.sha256()))));
  }

  // 3. It must run here and say it is the version signed.
  if (chmod(staged.c_str(), 0755) != 0) return discard(ErrnoStatus("cannot chmod", staged));
  bool truncated = false;
  absl::StatusOr<std::string> said =
      RunCapped({staged.string(), "--version"}, std::chrono::seconds(10), 256, &truncated, &stop);
  std::string expected = fmt::format("bcd {}\n", payload.version());
  if (!said.ok() || *said != expected) {
    return discard(absl::FailedPreconditionError(fmt::format(
        "the release does not run here: `{} --version` {}", staged.filename().string(),
        said.ok() ? fmt::format("printed \"{}\", not \"{}\"", absl::CEscape(said->substr(0, 80)),
                                absl::CEscape(expected))
                  : std::string(ToStd(said.status().message())))));
  }
  if (stop) return discard(absl::CancelledError("stopped before the swap"));

  // 4. The swap: the old binary kept, the marker, the new binary in place.
  if (absl::Status s = KeepPrevious(layout); !s.ok()) return discard(Prefixed(s, "swap"));
  int64_t now = o_.now();
  Trial trial{.command_id = command.command_id(),
              .from = o_.running,
              .to = payload.version(),
              .began = now,
              .deadline = now + o_.limits.trial_seconds,
              .starts = 0,
              .stage = Stage::kSwapping,
              .argv = o_.argv,
              .binary = layout.binary.string()};
  if (absl::Status s = WriteTrial(layout, trial); !s.ok()) return discard(Prefixed(s, "swap"));
  if (absl::Status s = Install(layout); !s.ok()) {
    (void)ClearTrial(layout);
    return discard(Prefixed(s, "swap"));
  }
  trial.stage = Stage::kTrial;
  if (absl::Status s = WriteTrial(layout, trial); !s.ok()) {
    // The new binary is in place and the marker says "swapping": the next start decides alike.
    o_.log->Warn("upgrade.marker_failed", {{"error", std::string(ToStd(s.message()))}});
  }
  o_.log->Info("upgrade.swapped", {{"command_id", command.command_id()},
                                   {"from", o_.running},
                                   {"to", payload.version()},
                                   {"binary", layout.binary.string()}});
  // 5. Over to the new version: the command stays running until it reports.
  o_.restart(/*guard=*/true, layout.binary, {});
  return HandedOver(
      fmt::format("re-executing {} as {}", layout.binary.string(), payload.version()));
}

absl::StatusOr<Upgrader::Resumed> Upgrader::Resume() {
  if (o_.layout.binary.empty()) return Resumed{};
  absl::StatusOr<std::optional<Trial>> read = ReadTrial(o_.layout);
  if (!read.ok()) return read.status();
  switch (Decide(*read, o_.running)) {
    case Verdict::kNothing: {
      // A version that starts outside an upgrade ran here: nothing lower is installed again.
      if (std::optional<Semver> running = Semver::Parse(o_.running)) {
        if (absl::Status s = RecordHighest(o_.layout, *running); !s.ok()) return s;
      }
      unlink(o_.layout.download().c_str());  // what an interrupted download left
      return Resumed{};
    }
    case Verdict::kOnTrial: {
      Trial trial = **read;
      trial.starts++;
      trial.stage = Stage::kTrial;
      if (absl::Status s = WriteTrial(o_.layout, trial); !s.ok()) return s;
      o_.log->Info("upgrade.trial", {{"command_id", trial.command_id},
                                     {"from", trial.from},
                                     {"to", trial.to},
                                     {"seconds_left", std::to_string(trial.deadline - o_.now())}});
      watch_ = std::thread([this, trial] { Watch(trial); });
      return Resumed{.claimed = trial.command_id};
    }
    case Verdict::kRollBack: {
      const Trial& trial = **read;
      std::string reason = fmt::format(
          "the new version {} started again during its trial (it crashed or was stopped)",
          trial.to);
      if (absl::Status s = RollBack(LayoutOf(trial), trial, reason); !s.ok()) return s;
      o_.log->Warn("upgrade.rolled_back",
                   {{"command_id", trial.command_id}, {"to", trial.from}, {"reason", reason}});
      return Resumed{.claimed = trial.command_id,
                     .restart = true,
                     .binary = LayoutOf(trial).binary,
                     .argv = trial.argv};
    }
    case Verdict::kConfirm: {
      Report(**read, /*succeeded=*/true, "");
      return Resumed{};
    }
    case Verdict::kReport: {
      const Trial& trial = **read;
      std::string message =
          trial.stage == Stage::kRolledBack
              ? fmt::format("rolled back to {}: {}", trial.from, trial.reason)
              : fmt::format(
                    "the upgrade to {} did not complete: bcd (now {}) stopped before "
                    "the new version ran",
                    trial.to, o_.running);
      Report(trial, /*succeeded=*/false, message);
      unlink(LayoutOf(trial).download().c_str());
      return Resumed{};
    }
  }
  return Resumed{};
}

Layout Upgrader::LayoutOf(const Trial& trial) const {
  Layout layout = o_.layout;
  if (!trial.binary.empty()) layout.binary = trial.binary;
  return layout;
}

void Upgrader::Watch(Trial trial) {
  auto left = std::chrono::seconds(std::max<int64_t>(trial.deadline - o_.now(), 0));
  auto until = std::chrono::steady_clock::now() + left;
  bool welcomed = false;
  while (!stopping_ && !welcomed && std::chrono::steady_clock::now() < until) {
    welcomed = o_.welcomed(std::chrono::milliseconds(200));
  }
  if (welcomed) {
    Confirm(std::move(trial));
    return;
  }
  if (stopping_) return;  // stopped during the trial: the next start rolls back
  std::string last = o_.last_error();
  std::string reason = fmt::format(
      "the new version {} was not welcomed by the gateway within {} s{}", trial.to,
      trial.deadline - trial.began, last.empty() ? "" : " (" + last.substr(0, 200) + ")");
  if (absl::Status s = RollBack(LayoutOf(trial), trial, reason); !s.ok()) {
    o_.log->Error("upgrade.rollback_failed", {{"error", std::string(ToStd(s.message()))}});
    return;  // the guard tries again
  }
  o_.log->Warn("upgrade.rolled_back",
               {{"command_id", trial.command_id}, {"to", trial.from}, {"reason", reason}});
  o_.restart(/*guard=*/false, LayoutOf(trial).binary, trial.argv);
}

void Upgrader::Confirm(Trial trial) {
  if (std::optional<Semver> to = Semver::Parse(trial.to)) {
    if (absl::Status s = RecordHighest(o_.layout, *to); !s.ok()) {
      o_.log->Warn("upgrade.highest_failed", {{"error", std::string(ToStd(s.message()))}});
    }
  }
  trial.stage = Stage::kConfirmed;
  if (absl::Status s = WriteTrial(o_.layout, trial); !s.ok()) {
    o_.log->Warn("upgrade.marker_failed", {{"error", std::string(ToStd(s.message()))}});
  }
  Report(trial, /*succeeded=*/true, "");
}

void Upgrader::Report(const Trial& trial, bool succeeded, const std::string& message) {
  bool rolled_back = trial.stage == Stage::kRolledBack;
  v1::DaemonUpgradeResult result;
  result.set_previous_version(succeeded ? trial.from : trial.to);
  result.set_version(o_.running);
  result.set_rolled_back(rolled_back);
  v1::CommandUpdate update;
  update.set_command_id(trial.command_id);
  update.set_result(result.SerializeAsString());
  if (succeeded) {
    update.set_state(v1::COMMAND_STATE_SUCCEEDED);
    o_.log->Info("upgrade.confirmed",
                 {{"command_id", trial.command_id}, {"from", trial.from}, {"to", trial.to}});
  } else {
    update.set_state(v1::COMMAND_STATE_FAILED);
    update.set_code(v1::COMMAND_CODE_HANDLER_FAILED);
    update.set_message(message);
    if (rolled_back) {
      o_.event(v1::SEVERITY_ERROR, "daemon.upgrade_rolled_back", message,
               {{"command_id", trial.command_id}, {"from", trial.from}, {"to", trial.to}});
    }
  }
  o_.resolve(update);
  nlohmann::json last = {{"command_id", trial.command_id},
                         {"from", trial.from},
                         {"to", trial.to},
                         {"outcome", succeeded     ? "succeeded"
                                     : rolled_back ? "rolled_back"
                                                   : "failed"},
                         {"reason", succeeded ? "" : message},
                         {"at", o_.now()}};
  if (absl::Status s = RecordLast(o_.layout, last.dump() + "\n"); !s.ok()) {
    o_.log->Warn("upgrade.last_failed", {{"error", std::string(ToStd(s.message()))}});
  }
  if (absl::Status s = ClearTrial(o_.layout); !s.ok()) {
    o_.log->Warn("upgrade.marker_failed", {{"error", std::string(ToStd(s.message()))}});
  }
}

}  // namespace bcd::upgrade
