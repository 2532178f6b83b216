#pragma once

// What became of every command id: running, or its terminal update, remembered for at least 24 h
// and persisted (record_log.h), so a redelivered command is answered from here and never runs
// twice, and a restart can tell which commands it interrupted. Not thread-safe.

#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "bettercompute/agent/v1/commands.pb.h"
#include "daemon/record_log.h"

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

 private:
  explicit ResultStore(RecordLog log) : log_(std::move(log)) {}
  RecordLog log_;
  std::map<std::string, std::string> running_;  // id -> kind
  std::map<std::string, std::pair<int64_t, bettercompute::agent::v1::CommandUpdate>> terminal_;
};

}  // namespace bcd
