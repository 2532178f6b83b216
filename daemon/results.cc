#include "daemon/results.h"

#include "fmt/format.h"
#include "proto/signing_input.h"

namespace bcd {

namespace v1 = bettercompute::agent::v1;

namespace {

// Records: "R" id '\0' kind (running), or "T" uint64_be(time) update-bytes (terminal).
std::string RunningRecord(const std::string& id, const std::string& kind) {
  return "R" + id + '\0' + kind;
}
std::string TerminalRecord(int64_t time, const v1::CommandUpdate& update) {
  return "T" + proto::Uint64Be(static_cast<uint64_t>(time)) + update.SerializeAsString();
}

}  // namespace

absl::StatusOr<ResultStore> ResultStore::Open(const std::filesystem::path& dir, int64_t now) {
  std::vector<std::string> records;
  absl::StatusOr<RecordLog> log = RecordLog::Open(dir / "results.log", &records);
  if (!log.ok()) return log.status();
  ResultStore store(*std::move(log));
  for (std::size_t i = 0; i < records.size(); ++i) {
    const std::string& r = records[i];
    if (!r.empty() && r[0] == 'R' && r.find('\0') != std::string::npos) {
      std::size_t zero = r.find('\0');
      store.running_[r.substr(1, zero - 1)] = r.substr(zero + 1);
      continue;
    }
    v1::CommandUpdate update;
    if (r.size() < 9 || r[0] != 'T' || !update.ParseFromString(r.substr(9))) {
      return absl::DataLossError(
          fmt::format("{}: record {} is not a command result", (dir / "results.log").string(), i));
    }
    int64_t time = 0;
    for (int b = 1; b <= 8; ++b) time = time << 8 | static_cast<unsigned char>(r[b]);
    store.running_.erase(update.command_id());
    store.terminal_[update.command_id()] = {time, update};
  }
  // Forget what is older than a day; rewrite the log when that shrank it.
  std::size_t before = store.terminal_.size();
  std::erase_if(store.terminal_,
                [&](const auto& entry) { return entry.second.first + kKeepSeconds < now; });
  if (store.terminal_.size() != before) {
    std::vector<std::string> keep;
    for (const auto& [id, kind] : store.running_) keep.push_back(RunningRecord(id, kind));
    for (const auto& [id, entry] : store.terminal_)
      keep.push_back(TerminalRecord(entry.first, entry.second));
    if (absl::Status s = store.log_.Rewrite(keep); !s.ok()) return s;
  }
  return store;
}

std::optional<v1::CommandUpdate> ResultStore::Terminal(const std::string& command_id) const {
  auto it = terminal_.find(command_id);
  if (it == terminal_.end()) return std::nullopt;
  return it->second.second;
}

absl::Status ResultStore::MarkRunning(const std::string& command_id, const std::string& kind) {
  if (absl::Status s = log_.Append(RunningRecord(command_id, kind)); !s.ok()) return s;
  running_[command_id] = kind;
  return absl::OkStatus();
}

absl::Status ResultStore::Remember(const v1::CommandUpdate& terminal, int64_t now) {
  if (absl::Status s = log_.Append(TerminalRecord(now, terminal)); !s.ok()) return s;
  running_.erase(terminal.command_id());
  terminal_[terminal.command_id()] = {now, terminal};
  return absl::OkStatus();
}

}  // namespace bcd
