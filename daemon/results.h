#pragma once

// What became of every command id: running, or its terminal update, remembered for at least 24 h
// and persisted (record_log.h), so a redelivered command is answered from here and never runs
// twice, and a restart can tell which commands it interrupted. Not thread-safe.

#include <chrono>
#include <deque>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "bettercompute/agent/v1/commands.pb.h"
#include "bettercompute/agent/v1/session.pb.h"
#include "daemon/record_log.h"
#include "pki/approvals.h"

namespace bcd {

class ResultStore {
 public:
  static constexpr int64_t kKeepSeconds = 24 * 3600;

  static absl::StatusOr<ResultStore> Open(const std::filesystem::path& dir, int64_t now);

  // The terminal update of `command_id`, if it finished within the last 24 h.
  std::optional<bettercompute::agent::v1::CommandUpdate> Terminal(
      const std::string& command_id) const;
  bool Running(const std::string& command_id) const { return running_.contains(command_id); }
  // Ids that were running when the daemon last stopped (or are running now), with their kinds.
  const std::map<std::string, std::string>& running() const { return running_; }

  absl::Status MarkRunning(const std::string& command_id, const std::string& kind);
  absl::Status Remember(const bettercompute::agent::v1::CommandUpdate& terminal, int64_t now);
  // Records the terminal updates in `pending` (the outbox after a restart) of commands with no
  // result here: they finished and their update reached the outbox when the daemon stopped, before
  // the result was recorded here. Returns how many it recorded.
  absl::StatusOr<int> Reconcile(const std::deque<bettercompute::agent::v1::AgentFrame>& pending,
                                int64_t now);
  // The per-node hourly limit on unbatched destructive commands (pki::HourlyLimit), persisted here
  // so a restart does not reset the count.
  absl::Status TakeHourly(int64_t now, uint32_t per_hour);
  std::size_t size() const { return terminal_.size(); }

 private:
  explicit ResultStore(RecordLog log) : log_(std::move(log)) {}
  // Forgets results older than a day and rewrites the log without them and without superseded
  // records.
  absl::Status Compact(int64_t now);
  RecordLog log_;
  std::map<std::string, std::string> running_;  // id -> kind
  // id -> (time recorded, serialized terminal CommandUpdate); kept as bytes, which is smaller.
  std::map<std::string, std::pair<int64_t, std::string>> terminal_;
  pki::HourlyLimit hourly_;
  std::size_t records_ = 0;  // records in the log, to know when compaction pays
  int64_t last_compacted_ = 0;
};

bool IsTerminal(bettercompute::agent::v1::CommandState state);

}  // namespace bcd
