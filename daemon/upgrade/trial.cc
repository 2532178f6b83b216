#include "daemon/upgrade/trial.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "base/fd.h"
#include "base/files.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "proto/absl_compat.h"

namespace bcd::upgrade {
namespace {

constexpr std::size_t kMaxStateFile = 64 * 1024;

absl::Status EnsureDir(const Layout& layout) {
  if (mkdir(layout.dir().c_str(), 0700) != 0 && errno != EEXIST)
    return ErrnoStatus("cannot create", layout.dir());
  return absl::OkStatus();
}

absl::Status SyncDir(const std::filesystem::path& dir) {
  Fd fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) return ErrnoStatus("cannot open", dir);
  if (SyncFile(fd.get()) != 0) return ErrnoStatus("cannot sync", dir);
  return absl::OkStatus();
}

// `target` becomes another name of `source`'s file, by rename of a fresh link: at no moment is
// `target` missing or partial.
absl::Status LinkOver(const std::filesystem::path& source, const std::filesystem::path& target) {
  std::filesystem::path temp = target.string() + ".tmp";
  unlink(temp.c_str());
  if (link(source.c_str(), temp.c_str()) != 0)
    return ErrnoStatus("cannot link " + source.string() + " to", temp);
  if (rename(temp.c_str(), target.c_str()) != 0) {
    absl::Status s = ErrnoStatus("cannot rename into place", target);
    unlink(temp.c_str());
    return s;
  }
  return SyncDir(target.parent_path());
}

std::optional<Stage> StageOf(std::string_view name) {
  for (Stage s : {Stage::kSwapping, Stage::kTrial, Stage::kConfirmed, Stage::kRolledBack}) {
    if (StageName(s) == name) return s;
  }
  return std::nullopt;
}

}  // namespace

std::string_view StageName(Stage stage) {
  switch (stage) {
    case Stage::kSwapping:
      return "swapping";
    case Stage::kTrial:
      return "trial";
    case Stage::kConfirmed:
      return "confirmed";
    case Stage::kRolledBack:
      return "rolled_back";
  }
  return "?";
}

absl::StatusOr<std::optional<Trial>> ReadTrial(const Layout& layout) {
  absl::StatusOr<std::string> text = ReadWholeFile(layout.marker(), kMaxStateFile);
  if (absl::IsNotFound(text.status())) return std::nullopt;
  if (!text.ok()) return text.status();
  nlohmann::json doc = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](std::string_view what) {
    return absl::DataLossError(fmt::format("{}: {}", layout.marker().string(), what));
  };
  if (!doc.is_object()) return bad("not a JSON object");
  Trial trial;
  try {
    trial.command_id = doc.at("command_id").get<std::string>();
    trial.from = doc.at("from").get<std::string>();
    trial.to = doc.at("to").get<std::string>();
    trial.began = doc.at("began").get<int64_t>();
    trial.deadline = doc.at("deadline").get<int64_t>();
    trial.starts = doc.at("starts").get<int>();
    trial.reason = doc.value("reason", "");
    trial.argv = doc.value("argv", std::vector<std::string>{});
    trial.binary = doc.value("binary", "");
    std::optional<Stage> stage = StageOf(doc.at("stage").get<std::string>());
    if (!stage) return bad("unknown stage");
    trial.stage = *stage;
  } catch (const nlohmann::json::exception& e) {
    return bad(e.what());
  }
  return trial;
}

absl::Status WriteTrial(const Layout& layout, const Trial& trial) {
  if (absl::Status s = EnsureDir(layout); !s.ok()) return s;
  nlohmann::json doc = {{"command_id", trial.command_id},
                        {"from", trial.from},
                        {"to", trial.to},
                        {"began", trial.began},
                        {"deadline", trial.deadline},
                        {"starts", trial.starts},
                        {"stage", StageName(trial.stage)},
                        {"reason", trial.reason},
                        {"argv", trial.argv},
                        {"binary", trial.binary}};
  return AtomicWriteFile(layout.marker(), doc.dump() + "\n", 0600);
}

absl::Status ClearTrial(const Layout& layout) {
  if (unlink(layout.marker().c_str()) != 0 && errno != ENOENT)
    return ErrnoStatus("cannot remove", layout.marker());
  return SyncDir(layout.dir());
}

absl::StatusOr<std::optional<Semver>> ReadHighest(const Layout& layout) {
  absl::StatusOr<std::string> text = ReadWholeFile(layout.highest(), 256);
  if (absl::IsNotFound(text.status())) return std::nullopt;
  if (!text.ok()) return text.status();
  std::string line = text->substr(0, text->find('\n'));
  std::optional<Semver> version = Semver::Parse(line);
  if (!version) {
    return absl::DataLossError(
        fmt::format("{}: \"{}\" is not a version", layout.highest().string(), line.substr(0, 64)));
  }
  return version;
}

absl::Status RecordHighest(const Layout& layout, const Semver& version) {
  absl::StatusOr<std::optional<Semver>> highest = ReadHighest(layout);
  if (!highest.ok()) return highest.status();
  if (*highest && Compare(**highest, version) >= 0) return absl::OkStatus();
  if (absl::Status s = EnsureDir(layout); !s.ok()) return s;
  return AtomicWriteFile(layout.highest(), version.ToString() + "\n", 0600);
}

absl::Status RecordLast(const Layout& layout, const std::string& json) {
  if (absl::Status s = EnsureDir(layout); !s.ok()) return s;
  return AtomicWriteFile(layout.last(), json, 0600);
}

absl::StatusOr<std::string> ReadLast(const Layout& layout) {
  return ReadWholeFile(layout.last(), kMaxStateFile);
}

nlohmann::json UpgradeStatus(const Layout& layout) {
  nlohmann::json status = nlohmann::json::object();
  auto error = [](const absl::Status& s) {
    return nlohmann::json{{"error", std::string(ToStd(s.message()))}};
  };
  if (!layout.binary.empty()) {
    status["binary"] = layout.binary.string();
    std::error_code ec;
    status["previous_binary"] = std::filesystem::exists(layout.previous(), ec)
                                    ? nlohmann::json(layout.previous().string())
                                    : nlohmann::json(nullptr);
  }
  absl::StatusOr<std::optional<Semver>> highest = ReadHighest(layout);
  status["highest"] = !highest.ok() ? error(highest.status())
                      : *highest    ? nlohmann::json((*highest)->ToString())
                                    : nlohmann::json(nullptr);
  absl::StatusOr<std::string> last = ReadLast(layout);
  if (absl::IsNotFound(last.status())) {
    status["last"] = nullptr;
  } else if (!last.ok()) {
    status["last"] = error(last.status());
  } else {
    status["last"] = nlohmann::json::parse(*last, nullptr, /*allow_exceptions=*/false);
    if (status["last"].is_discarded()) status["last"] = error(absl::DataLossError("not JSON"));
  }
  absl::StatusOr<std::optional<Trial>> trial = ReadTrial(layout);
  if (!trial.ok()) {
    status["under_way"] = error(trial.status());
  } else if (!*trial) {
    status["under_way"] = nullptr;
  } else {
    status["under_way"] = {{"command_id", (*trial)->command_id},
                           {"from", (*trial)->from},
                           {"to", (*trial)->to},
                           {"stage", StageName((*trial)->stage)},
                           {"deadline", (*trial)->deadline}};
  }
  return status;
}

absl::Status KeepPrevious(const Layout& layout) {
  return LinkOver(layout.binary, layout.previous());
}

absl::Status Install(const Layout& layout) {
  if (rename(layout.download().c_str(), layout.binary.c_str()) != 0)
    return ErrnoStatus("cannot rename the release over", layout.binary);
  return SyncDir(layout.binary.parent_path());
}

absl::Status Restore(const Layout& layout) { return LinkOver(layout.previous(), layout.binary); }

Verdict Decide(const std::optional<Trial>& trial, std::string_view running) {
  if (!trial) return Verdict::kNothing;
  switch (trial->stage) {
    case Stage::kConfirmed:
      return Verdict::kConfirm;
    case Stage::kRolledBack:
      return Verdict::kReport;
    case Stage::kSwapping:
    case Stage::kTrial:
      if (running != trial->to) return Verdict::kReport;
      return trial->starts == 0 ? Verdict::kOnTrial : Verdict::kRollBack;
  }
  return Verdict::kReport;
}

absl::Status RollBack(const Layout& layout, Trial trial, const std::string& reason) {
  if (absl::Status s = Restore(layout); !s.ok()) return s;
  trial.stage = Stage::kRolledBack;
  trial.reason = reason;
  return WriteTrial(layout, trial);
}

absl::StatusOr<std::string> Recover(const Layout& layout) {
  absl::StatusOr<std::optional<Trial>> trial = ReadTrial(layout);
  if (!trial.ok()) return trial.status();
  if (!*trial) return std::string("no upgrade under way");
  if ((*trial)->stage != Stage::kSwapping && (*trial)->stage != Stage::kTrial) {
    return fmt::format("the upgrade to {} is {}", (*trial)->to, StageName((*trial)->stage));
  }
  std::string reason =
      (*trial)->stage == Stage::kSwapping
          ? "bcd stopped during the swap, before the new version ran"
          : fmt::format("the new version stopped during its trial (it started {} time{})",
                        (*trial)->starts, (*trial)->starts == 1 ? "" : "s");
  if (absl::Status s = RollBack(layout, **trial, reason); !s.ok()) return s;
  return fmt::format("rolled back to {}: {}", (*trial)->from, reason);
}

namespace {

volatile sig_atomic_t guard_signalled = 0;
void OnGuardSignal(int) { guard_signalled = 1; }

bool Alive(pid_t pid) { return kill(pid, 0) == 0 || errno == EPERM; }

}  // namespace

int RunGuard(const GuardOptions& o) {
  struct sigaction action {};
  action.sa_handler = OnGuardSignal;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  signal(SIGHUP, SIG_IGN);
  while (true) {
    absl::StatusOr<std::optional<Trial>> trial = ReadTrial(o.layout);
    if (!trial.ok()) {
      o.say(fmt::format("cannot read the trial: {}", ToStd(trial.status().message())));
      return 1;
    }
    if (!*trial || (*trial)->stage == Stage::kConfirmed || (*trial)->stage == Stage::kRolledBack) {
      return 0;  // the trial ended: nothing for the guard to do
    }
    // The guard is the daemon's child: a new parent means the daemon is gone even if its PID was
    // not reaped yet.
    bool gone = !Alive(o.main) || getppid() != o.main;
    bool late = o.now() > (*trial)->deadline + o.grace.count();
    if (guard_signalled && !gone) return 0;  // the service is stopping: the next start decides
    if (gone || late) {
      std::string reason =
          gone ? fmt::format("the new version {} exited during its trial", (*trial)->to)
               : fmt::format("the new version {} was not welcomed by the gateway in time",
                             (*trial)->to);
      if (absl::Status s = RollBack(o.layout, **trial, reason); !s.ok()) {
        o.say(fmt::format("cannot roll back: {}", ToStd(s.message())));
        return 1;
      }
      o.say(fmt::format("rolled back to {}: {}", (*trial)->from, reason));
      if (!gone) {
        kill(o.main, SIGKILL);
        // Until it is gone (and its lock on the state dir with it): the daemon is our parent.
        for (int i = 0; i < 100 && getppid() == o.main; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      }
      if (o.supervised || guard_signalled || o.restart.empty()) return 0;
      std::vector<char*> argv;
      for (const std::string& arg : o.restart) argv.push_back(const_cast<char*>(arg.c_str()));
      argv.push_back(nullptr);
      execv(o.layout.binary.c_str(), argv.data());
      o.say(fmt::format("cannot start {}: {}", o.layout.binary.string(), strerror(errno)));
      return 1;
    }
    std::this_thread::sleep_for(o.poll);
  }
}

}  // namespace bcd::upgrade
