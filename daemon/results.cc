#include "daemon/results.h"

#include "fmt/format.h"
#include "proto/signing_input.h"

namespace bcd {

namespace v1 = bettercompute::agent::v1;

namespace {

// Records: "R" id '\0' kind (running), "T" uint64_be(time) update-bytes (terminal), or
// "H" uint64_be(time) (one unbatched destructive command counted against the hourly limit).
std::string RunningRecord(const std::string& id, const std::string& kind) {
  return "R" + id + '\0' + kind;
}
std::string TimedRecord(char type, int64_t time, std::string_view bytes = {}) {
  return type + proto::Uint64Be(static_cast<uint64_t>(time)) + std::string(bytes);
}
int64_t TimeOf(const std::string& record) {
  int64_t time = 0;
  for (int b = 1; b <= 8; ++b) time = time << 8 | static_cast<unsigned char>(record[b]);
  return time;
}

}  // namespace

bool IsTerminal(v1::CommandState state) {
  return state == v1::COMMAND_STATE_SUCCEEDED || state == v1::COMMAND_STATE_FAILED ||
         state == v1::COMMAND_STATE_REJECTED || state == v1::COMMAND_STATE_TIMED_OUT ||
         state == v1::COMMAND_STATE_CANCELLED;
}

absl::StatusOr<ResultStore> ResultStore::Open(const std::filesystem::path& dir, int64_t now) {
  std::vector<std::string> records;
  absl::StatusOr<RecordLog> log = RecordLog::Open(dir / "results.log", &records);
  if (!log.ok()) return log.status();
  ResultStore store(*std::move(log));
  store.records_ = records.size();
  for (std::size_t i = 0; i < records.size(); ++i) {
    const std::string& r = records[i];
    if (!r.empty() && r[0] == 'R' && r.find('\0') != std::string::npos) {
      std::size_t zero = r.find('\0');
      store.running_[r.substr(1, zero - 1)] = r.substr(zero + 1);
      continue;
    }
    if (r.size() == 9 && r[0] == 'H') {
      store.hourly_.Restore(TimeOf(r));
      continue;
    }
    v1::CommandUpdate update;
    if (r.size() < 9 || r[0] != 'T' || !update.ParseFromString(r.substr(9))) {
      return absl::DataLossError(
          fmt::format("{}: record {} is not a command result", (dir / "results.log").string(), i));
    }
    store.running_.erase(update.command_id());
    store.terminal_[update.command_id()] = {TimeOf(r), r.substr(9)};
  }
  if (absl::Status s = store.Compact(now); !s.ok()) return s;
  return store;
}

absl::Status ResultStore::Compact(int64_t now) {
  std::erase_if(terminal_,
                [&](const auto& entry) { return entry.second.first + kKeepSeconds < now; });
  std::size_t live = running_.size() + terminal_.size() + hourly_.taken().size();
  last_compacted_ = now;
  if (records_ <= live + live / 2 + 64) return absl::OkStatus();  // not worth a rewrite
  std::vector<std::string> keep;
  for (const auto& [id, kind] : running_) keep.push_back(RunningRecord(id, kind));
  for (const auto& [id, entry] : terminal_)
    keep.push_back(TimedRecord('T', entry.first, entry.second));
  for (int64_t at : hourly_.taken())
    if (at > now - 3600) keep.push_back(TimedRecord('H', at));
  if (absl::Status s = log_.Rewrite(keep); !s.ok()) return s;
  records_ = keep.size();
  return absl::OkStatus();
}

std::optional<v1::CommandUpdate> ResultStore::Terminal(const std::string& command_id) const {
  auto it = terminal_.find(command_id);
  if (it == terminal_.end()) return std::nullopt;
  v1::CommandUpdate update;
  if (!update.ParseFromString(it->second.second)) return std::nullopt;  // parsed when stored
  return update;
}

absl::Status ResultStore::MarkRunning(const std::string& command_id, const std::string& kind) {
  if (absl::Status s = log_.Append(RunningRecord(command_id, kind)); !s.ok()) return s;
  ++records_;
  running_[command_id] = kind;
  return absl::OkStatus();
}

absl::Status ResultStore::Remember(const v1::CommandUpdate& terminal, int64_t now) {
  std::string bytes = terminal.SerializeAsString();
  if (absl::Status s = log_.Append(TimedRecord('T', now, bytes)); !s.ok()) return s;
  ++records_;
  running_.erase(terminal.command_id());
  terminal_[terminal.command_id()] = {now, std::move(bytes)};
  // Hourly, forget what is past its day while running, so a long-lived daemon stays bounded.
  if (now - last_compacted_ >= 3600) return Compact(now);
  return absl::OkStatus();
}

absl::StatusOr<int> ResultStore::Reconcile(const std::deque<v1::AgentFrame>& pending, int64_t now) {
  int recorded = 0;
  for (const v1::AgentFrame& frame : pending) {
    if (!frame.has_command_update()) continue;
    const v1::CommandUpdate& update = frame.command_update();
    if (!IsTerminal(update.state()) || terminal_.contains(update.command_id())) continue;
    if (absl::Status s = Remember(update, now); !s.ok()) return s;
    ++recorded;
  }
  return recorded;
}

absl::Status ResultStore::TakeHourly(int64_t now, uint32_t per_hour) {
  if (absl::Status s = hourly_.Take(now, per_hour); !s.ok()) return s;
  if (absl::Status s = log_.Append(TimedRecord('H', now)); !s.ok()) return s;
  ++records_;
  return absl::OkStatus();
}

}  // namespace bcd
