#pragma once

// What became of every command id: running, or its terminal update, remembered for at least 24 h
// and persisted (record_log.h), so a redelivered command is answered from here and never runs
// twice, and a restart can tell which commands it interrupted. Terminal updates stay on disk: in
// memory each costs an index entry (a 64-bit hash of its id, its time and where its record
// starts), read back when a redelivery asks. Not thread-safe.

#include <chrono>
#include <deque>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "bettercompute/agent/v1/commands.pb.h"
#include "bettercompute/agent/v1/session.pb.h"
#include "daemon/delivery/record_log.h"
#include "pki/approvals.h"

namespace bcd {

struct ResultLimits {
  std::size_t max_entries = 200000;          // results of the last 24 h
  uint64_t max_bytes = uint64_t{256} << 20;  // of results.log after compaction
};

class ResultStore {
 public:
  static constexpr int64_t kKeepSeconds = 24 * 3600;

  static absl::StatusOr<ResultStore> Open(const std::filesystem::path& dir, int64_t now,
                                          ResultLimits limits = {});

  // The terminal update of `command_id`, if it finished within the last 24 h, and the SHA-256 of
  // the command body it answered ("" for results recorded without one).
  struct Stored {
    bettercompute::agent::v1::CommandUpdate update;
    std::string body_sha256;
  };
  std::optional<Stored> Lookup(const std::string& command_id) const;
  std::optional<bettercompute::agent::v1::CommandUpdate> Terminal(
      const std::string& command_id) const;
  // OK while another result fits; ResourceExhausted saying what is full once the limits are
  // reached (after forgetting what is past its day). A command is taken only when its result will
  // fit, so one that runs is always remembered.
  absl::Status Room(int64_t now);
  bool Running(const std::string& command_id) const { return running_.contains(command_id); }
  // Ids that were running when the daemon last stopped (or are running now), with their kinds.
  const std::map<std::string, std::string>& running() const { return running_; }

  absl::Status MarkRunning(const std::string& command_id, const std::string& kind);
  absl::Status Remember(const bettercompute::agent::v1::CommandUpdate& terminal, int64_t now,
                        std::string_view body_sha256 = {});
  // Records the terminal updates in `pending` (the outbox after a restart) of commands with no
  // result here: they finished and their update reached the outbox when the daemon stopped, before
  // the result was recorded here. Returns how many it recorded.
  absl::StatusOr<int> Reconcile(const std::deque<bettercompute::agent::v1::AgentFrame>& pending,
                                int64_t now);
  // The per-node hourly limit on unbatched destructive commands (pki::HourlyLimit), persisted here
  // so a restart does not reset the count.
  absl::Status TakeHourly(int64_t now, uint32_t per_hour);
  std::size_t size() const { return terminal_.size() + overflow_.size(); }

 private:
  ResultStore(RecordLog log, ResultLimits limits) : log_(std::move(log)), limits_(limits) {}
  // Forgets results older than a day and rewrites the log without them and without superseded
  // records (when that pays, or always with `force`).
  absl::Status Compact(int64_t now, bool force = false);
  RecordLog log_;
  ResultLimits limits_;
  std::map<std::string, std::string> running_;  // id -> kind
  struct Entry {
    int64_t time;     // when it was recorded
    uint64_t offset;  // of its record in the log
  };
  // The entry of `command_id`, from the index or (for the rare ids whose hash another id took
  // first) the overflow map.
  const Entry* Find(const std::string& command_id) const;
  void Index(const std::string& command_id, Entry entry);
  absl::StatusOr<Stored> ReadTerminal(const Entry& entry) const;
  absl::flat_hash_map<uint64_t, Entry> terminal_;  // by hash of the command id
  std::map<std::string, Entry> overflow_;          // ids whose hash was taken by another id
  pki::HourlyLimit hourly_;
  std::size_t records_ = 0;  // records in the log, to know when compaction pays
  int64_t last_compacted_ = 0;
};

}  // namespace bcd
