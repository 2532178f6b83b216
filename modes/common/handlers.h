#pragma once

// The command handlers several modes share: inventory.refresh and logs.collect.

#include <chrono>
#include <filesystem>
#include <functional>

#include "base/clock.h"
#include "bettercompute/agent/v1/commands.pb.h"
#include "bettercompute/common/v1/common.pb.h"
#include "daemon/dispatch/dispatcher.h"
#include "modes/common/inventory.h"

namespace bcd {

// inventory.refresh: collects the hardware claims again and sends them as an `inventory` frame.
class InventoryRefreshHandler final
    : public TypedHandler<bettercompute::agent::v1::InventoryRefreshPayload,
                          bettercompute::agent::v1::InventoryRefreshResult> {
 public:
  InventoryRefreshHandler(
      InventorySources sources, UnixClock now,
      std::function<void(const bettercompute::common::v1::HardwareClaims&)> send)
      : sources_(std::move(sources)), now_(std::move(now)), send_(std::move(send)) {}
  absl::StatusOr<bettercompute::agent::v1::InventoryRefreshResult> Execute(
      const bettercompute::agent::v1::Command& command,
      const bettercompute::agent::v1::InventoryRefreshPayload& payload,
      const std::atomic<bool>& stop) override;

 private:
  InventorySources sources_;
  UnixClock now_;
  std::function<void(const bettercompute::common::v1::HardwareClaims&)> send_;
};

// Where logs.collect reads from. The programs are looked up on PATH; tests point them at scripts.
struct LogSources {
  std::string journalctl = "journalctl";
  std::string dmesg = "dmesg";
  std::string bcd_unit = "bcd.service";  // the unit whose journal holds bcd's own log
  std::filesystem::path work_dir;        // where the bundle is built (the state dir)
  UnixClock now;
};

// logs.collect: bcd's log, the journal units the payload names and dmesg, bundled as a .tar.gz
// (at most max_bytes of logs, 64 MiB when unset, 1 GiB at most; a source past the budget is cut
// and the result says truncated), uploaded with HTTP PUT to the presigned URL; the result carries
// the bundle's size and sha256 and what it holds. A source that cannot be read does not fail the
// command: its error goes into the bundle as errors.txt.
class LogsCollectHandler final : public TypedHandler<bettercompute::agent::v1::LogsCollectPayload,
                                                     bettercompute::agent::v1::LogsCollectResult> {
 public:
  using Upload = std::function<absl::Status(const struct UploadRequest&)>;
  LogsCollectHandler(LogSources sources, Upload upload)
      : sources_(std::move(sources)), upload_(std::move(upload)) {}
  absl::Status Check(const bettercompute::agent::v1::Command& command,
                     const bettercompute::agent::v1::LogsCollectPayload& payload) const override;
  absl::StatusOr<bettercompute::agent::v1::LogsCollectResult> Execute(
      const bettercompute::agent::v1::Command& command,
      const bettercompute::agent::v1::LogsCollectPayload& payload,
      const std::atomic<bool>& stop) override;

 private:
  LogSources sources_;
  Upload upload_;
};

}  // namespace bcd
