#pragma once

// The outbox: command updates and events wait here, in one per-node sequence, until an Ack covers
// them. Append persists (fsync) before it returns, so what the session sends survives a crash of
// either side; after a reconnect or restart everything not acknowledged is sent again, in order.
// Bounded: when full, Append refuses; the last slot is kept for one event of kind outbox.full,
// which the caller appends when a frame is refused, so the gateway learns that something was lost.
//
// Not thread-safe: the session engine owns it.

#include <cstdint>
#include <deque>
#include <filesystem>
#include <optional>

#include "absl/status/statusor.h"
#include "bettercompute/agent/v1/session.pb.h"
#include "daemon/delivery/record_log.h"

namespace bcd {

inline constexpr char kOutboxFullEvent[] = "outbox.full";

struct OutboxLimits {
  std::size_t max_entries = 100000;
};

class Outbox {
 public:
  static absl::StatusOr<Outbox> Open(const std::filesystem::path& dir, OutboxLimits limits = {});

  // Gives `frame` (a command_update or an event) the next seq and persists it.
  absl::StatusOr<bettercompute::agent::v1::AgentFrame> Append(
      bettercompute::agent::v1::AgentFrame frame);
  // Drops every entry with seq <= up_to_seq. The log is compacted once it is over kCompactBytes
  // and mostly acknowledged; only then is the acknowledged seq persisted. (Terminal updates'
  // results are durable in the result store before an Ack can cover them: SessionEngine.)
  absl::Status Ack(uint64_t up_to_seq);
  static constexpr uint64_t kCompactBytes = 1u << 20;

  const std::deque<bettercompute::agent::v1::AgentFrame>& pending() const { return pending_; }
  uint64_t last_acked() const { return last_acked_; }
  uint64_t next_seq() const { return next_seq_; }

 private:
  Outbox(std::filesystem::path dir, OutboxLimits limits, RecordLog log)
      : dir_(std::move(dir)), limits_(limits), log_(std::move(log)) {}

  std::filesystem::path dir_;
  OutboxLimits limits_;
  RecordLog log_;
  std::deque<bettercompute::agent::v1::AgentFrame> pending_;
  uint64_t last_acked_ = 0;
  uint64_t next_seq_ = 1;
  uint64_t pending_bytes_ = 0;  // framed bytes of pending_ in the log
};

// The seq of an outbox frame (command_update.seq or event.seq); 0 for any other frame.
uint64_t SeqOf(const bettercompute::agent::v1::AgentFrame& frame);

}  // namespace bcd
