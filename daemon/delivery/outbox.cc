#include "daemon/delivery/outbox.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

#include "base/files.h"
#include "fmt/format.h"
#include "proto/frame_codec.h"

namespace bcd {

namespace v1 = bettercompute::agent::v1;

namespace {

// Overwrites the hint in place, fixed width, without a sync: no rename, so no writeback of the
// file on every Ack. A process crash keeps it (the page cache survives); a machine crash may tear
// it, and an unreadable hint is ignored.
absl::Status WriteHint(const std::filesystem::path& path, uint64_t value) {
  std::string text = fmt::format("{:020}", value);
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(
        fmt::format("cannot open {}: {}", path.string(), std::strerror(errno)));
  }
  ssize_t n = pwrite(fd, text.data(), text.size(), 0);
  close(fd);
  if (n != static_cast<ssize_t>(text.size())) {
    return absl::InternalError(fmt::format("cannot write {}", path.string()));
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t SeqOf(const v1::AgentFrame& frame) {
  if (frame.has_command_update()) return frame.command_update().seq();
  if (frame.has_event()) return frame.event().seq();
  return 0;
}

absl::StatusOr<Outbox> Outbox::Open(const std::filesystem::path& dir, OutboxLimits limits) {
  std::vector<std::string> records;
  absl::StatusOr<RecordLog> log = RecordLog::Open(dir / "outbox.log", &records);
  if (!log.ok()) return log.status();
  Outbox outbox(dir, limits, *std::move(log));
  absl::StatusOr<std::string> acked = ReadWholeFile(dir / "outbox.acked", 64);
  if (acked.ok()) {
    auto [end, ec] =
        std::from_chars(acked->data(), acked->data() + acked->size(), outbox.last_acked_);
    if (ec != std::errc() || end != acked->data() + acked->size()) {
      return absl::DataLossError(
          fmt::format("{}: not a sequence number", (dir / "outbox.acked").string()));
    }
  } else if (!absl::IsNotFound(acked.status())) {
    return acked.status();
  }
  // The durable ack (written at compaction) is the floor of the numbering. The hint, written on
  // every Ack without a sync, only spares resending what was acknowledged since: when a machine
  // crash leaves it unreadable or behind, those entries go again and the gateway drops them.
  uint64_t highest = outbox.last_acked_;
  if (absl::StatusOr<std::string> hint = ReadWholeFile(dir / "outbox.acked.hint", 64); hint.ok()) {
    uint64_t value = 0;
    auto [end, ec] = std::from_chars(hint->data(), hint->data() + hint->size(), value);
    if (ec == std::errc() && end == hint->data() + hint->size())
      outbox.last_acked_ = std::max(outbox.last_acked_, value);
  }
  for (std::size_t i = 0; i < records.size(); ++i) {
    v1::AgentFrame frame;
    if (absl::Status s = proto::DecodeMessage(records[i], &frame); !s.ok() || SeqOf(frame) == 0) {
      return absl::DataLossError(
          fmt::format("{}: record {} is not an outbox frame", (dir / "outbox.log").string(), i));
    }
    highest = std::max(highest, SeqOf(frame));
    if (SeqOf(frame) > outbox.last_acked_) {
      outbox.pending_bytes_ += records[i].size() + 8;
      outbox.pending_.push_back(std::move(frame));
    }
  }
  outbox.next_seq_ = highest + 1;
  return outbox;
}

absl::StatusOr<v1::AgentFrame> Outbox::Append(v1::AgentFrame frame) {
  // The last slot is kept for the one outbox.full event that says the outbox filled up.
  bool notice = frame.has_event() && frame.event().kind() == kOutboxFullEvent;
  if (pending_.size() + (notice ? 0 : 1) >= limits_.max_entries) {
    return absl::ResourceExhaustedError(
        fmt::format("the outbox is full: {} entries wait for the gateway's Ack", pending_.size()));
  }
  if (frame.has_command_update()) {
    frame.mutable_command_update()->set_seq(next_seq_);
  } else if (frame.has_event()) {
    frame.mutable_event()->set_seq(next_seq_);
  } else {
    return absl::InvalidArgumentError("only command updates and events go through the outbox");
  }
  absl::StatusOr<std::string> bytes = proto::EncodeMessage(frame);
  if (!bytes.ok()) return bytes.status();
  if (absl::Status s = log_.Append(*bytes); !s.ok()) return s;
  ++next_seq_;
  pending_bytes_ += bytes->size() + 8;
  pending_.push_back(frame);
  return frame;
}

absl::Status Outbox::Ack(uint64_t up_to_seq) {
  if (up_to_seq <= last_acked_) return absl::OkStatus();
  up_to_seq =
      std::min(up_to_seq, next_seq_ - 1);  // an Ack beyond what was sent covers what was sent
  last_acked_ = up_to_seq;
  while (!pending_.empty() && SeqOf(pending_.front()) <= up_to_seq) {
    pending_bytes_ -= pending_.front().ByteSizeLong() + 8;
    pending_.pop_front();
  }
  // Every Ack is recorded as a hint without a sync: a machine crash may lose it, and the next start
  // then sends those entries again, which the gateway drops by seq; two syncs per Ack would cost
  // more than that. Compaction is when the ack must be durable: the log no longer holds the
  // entries, and the numbering must never go back.
  if (log_.bytes() < kCompactBytes || pending_bytes_ * 2 > log_.bytes()) {
    return WriteHint(dir_ / "outbox.acked.hint", last_acked_);
  }
  if (absl::Status s = AtomicWriteFile(dir_ / "outbox.acked", std::to_string(last_acked_), 0600);
      !s.ok()) {
    return s;
  }
  std::vector<std::string> keep;
  for (const v1::AgentFrame& frame : pending_) keep.push_back(frame.SerializeAsString());
  return log_.Rewrite(keep);
}

}  // namespace bcd
