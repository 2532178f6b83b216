#include "daemon/delivery/results.h"

#include "fmt/format.h"
#include "proto/kinds.h"
#include "proto/signing_input.h"

namespace bcd {

namespace v1 = bettercompute::agent::v1;

namespace {

// Records: "R" id '\0' kind (running); "B" uint64_be(time) sha256(body) update-bytes (terminal,
// with the SHA-256 of the command body it answers), or "T" uint64_be(time) update-bytes (terminal,
// recorded before bodies were hashed); "H" uint64_be(time) (one unbatched destructive command
// counted against the hourly limit).
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

// The update and body hash of a terminal record; nullopt when it is not one.
std::optional<ResultStore::Stored> ParseTerminal(const std::string& record) {
  ResultStore::Stored stored;
  if (record.size() >= 41 && record[0] == 'B') {
    stored.body_sha256 = record.substr(9, 32);
    if (stored.body_sha256 == std::string(32, '\0')) stored.body_sha256.clear();  // none given
    if (!stored.update.ParseFromString(record.substr(41))) return std::nullopt;
    return stored;
  }
  if (record.size() >= 9 && record[0] == 'T' && stored.update.ParseFromString(record.substr(9)))
    return stored;
  return std::nullopt;
}

}  // namespace

absl::StatusOr<ResultStore> ResultStore::Open(const std::filesystem::path& dir, int64_t now,
                                              ResultLimits limits) {
  std::vector<std::string> records;
  std::vector<uint64_t> offsets;
  absl::StatusOr<RecordLog> log = RecordLog::Open(dir / "results.log", &records, &offsets);
  if (!log.ok()) return log.status();
  ResultStore store(*std::move(log), limits);
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
    std::optional<Stored> terminal = ParseTerminal(r);
    if (!terminal) {
      return absl::DataLossError(
          fmt::format("{}: record {} is not a command result", (dir / "results.log").string(), i));
    }
    const std::string& id = terminal->update.command_id();
    store.running_.erase(id);
    store.Index(id, {TimeOf(r), offsets[i]});
  }
  if (absl::Status s = store.Compact(now); !s.ok()) return s;
  return store;
}

const ResultStore::Entry* ResultStore::Find(const std::string& command_id) const {
  if (auto it = overflow_.find(command_id); it != overflow_.end()) return &it->second;
  auto it = terminal_.find(std::hash<std::string>()(command_id));
  return it == terminal_.end() ? nullptr : &it->second;
}

void ResultStore::Index(const std::string& command_id, Entry entry) {
  if (auto it = overflow_.find(command_id); it != overflow_.end()) {
    it->second = entry;
    return;
  }
  auto [it, fresh] = terminal_.try_emplace(std::hash<std::string>()(command_id), entry);
  if (fresh) return;
  // The hash is taken: by this id (a newer result) or, very rarely, by another one.
  absl::StatusOr<Stored> held = ReadTerminal(it->second);
  if (held.ok() && held->update.command_id() != command_id) {
    overflow_[command_id] = entry;
  } else {
    it->second = entry;
  }
}

absl::StatusOr<ResultStore::Stored> ResultStore::ReadTerminal(const Entry& entry) const {
  absl::StatusOr<std::string> record = log_.Read(entry.offset);
  if (!record.ok()) return record.status();
  std::optional<Stored> stored = ParseTerminal(*record);
  if (!stored) {
    return absl::DataLossError(fmt::format("results: no command result at byte {}", entry.offset));
  }
  return *std::move(stored);
}

absl::Status ResultStore::Room(int64_t now) {
  auto full = [&] { return size() >= limits_.max_entries || log_.bytes() >= limits_.max_bytes; };
  // Forgetting what is past its day frees room; tried at most once a minute, so a full store is
  // not rewritten for every command refused meanwhile.
  if (full() && now - last_compacted_ >= 60) {
    if (absl::Status s = Compact(now, /*force=*/true); !s.ok()) return s;
  }
  if (!full()) return absl::OkStatus();
  return absl::ResourceExhaustedError(fmt::format(
      "the result store is full ({} results of the last 24 h, {} bytes; the limits are {} and {}): "
      "commands are refused until older results are forgotten",
      size(), log_.bytes(), limits_.max_entries, limits_.max_bytes));
}

absl::Status ResultStore::Compact(int64_t now, bool force) {
  auto expired = [&](const auto& item) { return item.second.time + kKeepSeconds < now; };
  absl::erase_if(terminal_, expired);
  std::erase_if(overflow_, expired);
  std::size_t live = running_.size() + size() + hourly_.taken().size();
  last_compacted_ = now;
  if (!force && records_ <= live + live / 2 + 64) return absl::OkStatus();  // not worth a rewrite
  std::vector<std::string> keep;
  for (const auto& [id, kind] : running_) keep.push_back(RunningRecord(id, kind));
  for (int64_t at : hourly_.taken())
    if (at > now - 3600) keep.push_back(TimedRecord('H', at));
  std::size_t first_terminal = keep.size();
  std::vector<Entry*> entries;
  for (auto& [hash, entry] : terminal_) entries.push_back(&entry);
  for (auto& [id, entry] : overflow_) entries.push_back(&entry);
  for (Entry* entry : entries) {
    absl::StatusOr<std::string> record = log_.Read(entry->offset);
    if (!record.ok()) return record.status();
    keep.push_back(*std::move(record));
  }
  std::vector<uint64_t> offsets;
  if (absl::Status s = log_.Rewrite(keep, &offsets); !s.ok()) return s;
  for (std::size_t i = 0; i < entries.size(); ++i) entries[i]->offset = offsets[first_terminal + i];
  records_ = keep.size();
  return absl::OkStatus();
}

std::optional<ResultStore::Stored> ResultStore::Lookup(const std::string& command_id) const {
  const Entry* entry = Find(command_id);
  if (entry == nullptr) return std::nullopt;
  absl::StatusOr<Stored> stored = ReadTerminal(*entry);
  // A result that cannot be read back is not an answer; the caller treats the id as new.
  if (!stored.ok() || stored->update.command_id() != command_id) return std::nullopt;
  return *std::move(stored);
}

std::optional<v1::CommandUpdate> ResultStore::Terminal(const std::string& command_id) const {
  std::optional<Stored> stored = Lookup(command_id);
  if (!stored) return std::nullopt;
  return std::move(stored->update);
}

absl::Status ResultStore::MarkRunning(const std::string& command_id, const std::string& kind) {
  if (absl::Status s = log_.Append(RunningRecord(command_id, kind)); !s.ok()) return s;
  ++records_;
  running_[command_id] = kind;
  return absl::OkStatus();
}

absl::Status ResultStore::Remember(const v1::CommandUpdate& terminal, int64_t now,
                                   std::string_view body_sha256) {
  uint64_t offset = log_.bytes();
  std::string hash(body_sha256);
  hash.resize(32, '\0');  // none given: zeros, which no body hashes to
  if (absl::Status s = log_.Append(TimedRecord('B', now, hash + terminal.SerializeAsString()));
      !s.ok())
    return s;
  ++records_;
  running_.erase(terminal.command_id());
  Index(terminal.command_id(), {now, offset});
  // Hourly, forget what is past its day while running, so a long-lived daemon stays bounded.
  if (now - last_compacted_ >= 3600) return Compact(now);
  return absl::OkStatus();
}

absl::StatusOr<int> ResultStore::Reconcile(const std::deque<v1::AgentFrame>& pending, int64_t now) {
  int recorded = 0;
  for (const v1::AgentFrame& frame : pending) {
    if (!frame.has_command_update()) continue;
    const v1::CommandUpdate& update = frame.command_update();
    if (!proto::IsTerminal(update.state()) || Terminal(update.command_id())) continue;
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
