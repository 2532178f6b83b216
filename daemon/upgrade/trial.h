#pragma once

// The swap and the trial of a daemon.upgrade, and what every process that starts makes of them.
//
// Files: beside the installed binary B, B.previous (the binary that ran before the last upgrade,
// kept) and .B.download (a release on its way in); in the state dir, upgrade/trial.json (the
// upgrade under way) and upgrade/highest (the highest version ever confirmed here), both written
// atomically and synced.
//
// The order that lets `kill -9` land anywhere:
//   1. the release is downloaded, checked and run (`--version`) as .B.download;
//   2. B is hard-linked to B.previous (a rename of a fresh link: B never goes missing);
//   3. the trial marker is written, stage "swapping": from now on B.previous is the old binary;
//   4. .B.download is renamed over B (atomic: B is always one complete binary), stage "trial";
//   5. the process re-executes B in place (same PID).
// The new process counts its start in the marker and is on trial until the gateway welcomes it;
// then "confirmed". Any failure before that (a crash, a hang, no welcome by the deadline, a second
// start) puts B.previous back at B (again by rename), stage "rolled_back" with the reason, and the
// old version, starting, reports the command FAILED from the marker. A guard process running the
// old binary (RunGuard) and, under systemd, the unit's ExecStartPre (Recover) do the rollback when
// the new binary cannot.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/upgrade/release.h"
#include "nlohmann/json.hpp"

namespace bcd::upgrade {

struct Layout {
  std::filesystem::path binary;     // the installed binary, what runs
  std::filesystem::path state_dir;  // the daemon's
  std::filesystem::path previous() const { return binary.string() + ".previous"; }
  std::filesystem::path download() const {
    return binary.parent_path() / ("." + binary.filename().string() + ".download");
  }
  std::filesystem::path dir() const { return state_dir / "upgrade"; }
  std::filesystem::path marker() const { return dir() / "trial.json"; }
  std::filesystem::path highest() const { return dir() / "highest"; }
  std::filesystem::path last() const { return dir() / "last.json"; }
};

enum class Stage { kSwapping, kTrial, kConfirmed, kRolledBack };
std::string_view StageName(Stage stage);

// The upgrade under way (upgrade/trial.json).
struct Trial {
  std::string command_id;
  std::string from, to;  // versions
  int64_t began = 0;     // unix seconds: when the swap began
  int64_t deadline = 0;  // unix seconds: the new version is welcomed by then or rolled back
  int starts = 0;        // how many times the new version started
  Stage stage = Stage::kSwapping;
  std::string reason;  // why it rolled back
  // The command line the old version ran with: a rollback starts the old binary with it (the new
  // version may have been started differently).
  std::vector<std::string> argv;
  // The installed binary swapped (the new version may run from elsewhere, through a wrapper).
  std::string binary;
};

absl::StatusOr<std::optional<Trial>> ReadTrial(const Layout& layout);
absl::Status WriteTrial(const Layout& layout, const Trial& trial);
absl::Status ClearTrial(const Layout& layout);

// The highest version confirmed here (nullopt before the first), and recording one (kept only
// when higher).
absl::StatusOr<std::optional<Semver>> ReadHighest(const Layout& layout);
absl::Status RecordHighest(const Layout& layout, const Semver& version);

// The last upgrade's outcome, for `bcd status` (upgrade/last.json, a JSON object: command_id,
// from, to, outcome "succeeded" | "failed" | "rolled_back", reason, at).
absl::Status RecordLast(const Layout& layout, const std::string& json);
absl::StatusOr<std::string> ReadLast(const Layout& layout);

// What `bcd status` shows of upgrades (docs/operations.md): the binary and the previous one kept
// (when the binary's path is known), the highest version confirmed here, the last upgrade's
// outcome and the one under way. Unreadable files show as {"error": ...}.
nlohmann::json UpgradeStatus(const Layout& layout);

// Step 2: B.previous becomes the binary now at B.
absl::Status KeepPrevious(const Layout& layout);
// Step 4: .B.download over B.
absl::Status Install(const Layout& layout);
// B.previous back at B (B.previous stays).
absl::Status Restore(const Layout& layout);

// What a process starting on version `running` does about the marker.
enum class Verdict {
  kNothing,   // no upgrade under way
  kOnTrial,   // this is the new version: count the start, wait for the welcome
  kRollBack,  // this is the new version starting again during its trial: put the old one back
  kConfirm,   // this is the new version, confirmed before a crash: report the success
  kReport,    // this is the old version: the upgrade failed (and was rolled back, or never ran)
};
Verdict Decide(const std::optional<Trial>& trial, std::string_view running);

// Puts the previous binary back and records why (stage rolled_back): what the guard, Recover and
// a failing new version all do.
absl::Status RollBack(const Layout& layout, Trial trial, const std::string& reason);

// ExecStartPre under systemd, run with the previous binary: a service start while an upgrade is
// neither confirmed nor rolled back means the process that was upgrading died (the old one during
// the swap, or the new one during its trial, which the guard could not catch). Rolls back then.
// Returns what it did, for the journal.
absl::StatusOr<std::string> Recover(const Layout& layout);

struct GuardOptions {
  Layout layout;
  pid_t main = 0;                    // the daemon's PID (the same before and after exec)
  std::vector<std::string> restart;  // argv to run the restored binary with, when unsupervised
  bool supervised = false;           // systemd restarts the service: exit after rolling back
  std::chrono::seconds grace{10};    // after the deadline, before the guard steps in
  std::chrono::milliseconds poll{200};
  std::function<int64_t()> now;                 // unix seconds
  std::function<void(const std::string&)> say;  // a line for the log
};
// The guard: runs the old binary beside the new one until the trial ends. When the new process
// dies, or is not confirmed `grace` after the deadline, it rolls back, kills the new process and,
// unsupervised, executes the restored binary with `restart` (so the node comes back); supervised,
// it exits and the service manager starts the restored binary. Returns the exit status when it
// does not exec.
int RunGuard(const GuardOptions& options);

}  // namespace bcd::upgrade
