#pragma once

// The node mode's command handlers.

#include <chrono>
#include <filesystem>
#include <functional>

#include "bettercompute/common/v1/common.pb.h"
#include "daemon/dispatcher.h"
#include "daemon/inventory.h"

namespace bcd {

// inventory.refresh: collects the hardware claims again and sends them as an `inventory` frame.
class InventoryRefreshHandler final : public CommandHandler {
 public:
  InventoryRefreshHandler(
      InventorySources sources,
      std::function<void(const bettercompute::common::v1::HardwareClaims&)> send)
      : sources_(std::move(sources)), send_(std::move(send)) {}
  absl::StatusOr<std::string> Run(const bettercompute::agent::v1::Command& command,
                                  const google::protobuf::Message& payload,
                                  const std::atomic<bool>& stop) override;

 private:
  InventorySources sources_;
  std::function<void(const bettercompute::common::v1::HardwareClaims&)> send_;
};

// Where logs.collect reads from. The programs are looked up on PATH; tests point them at scripts.
struct LogSources {
  std::string journalctl = "journalctl";
  std::string dmesg = "dmesg";
  std::string bcd_unit = "bcd.service";  // the unit whose journal holds bcd's own log
  std::filesystem::path work_dir;        // where the bundle is built (the state dir)
  std::function<int64_t()> now;
};

// logs.collect: bcd's log, the journal units the payload names and dmesg, bundled as a .tar.gz
// (at most max_bytes of logs, 64 MiB when unset, 1 GiB at most; a source past the budget is cut
// and the result says truncated), uploaded with HTTP PUT to the presigned URL; the result carries
// the bundle's size and sha256 and what it holds. A source that cannot be read does not fail the
// command: its error goes into the bundle as errors.txt.
class LogsCollectHandler final : public CommandHandler {
 public:
  using Upload = std::function<absl::Status(const struct UploadRequest&)>;
  LogsCollectHandler(LogSources sources, Upload upload)
      : sources_(std::move(sources)), upload_(std::move(upload)) {}
  absl::Status Validate(const bettercompute::agent::v1::Command& command,
                        const google::protobuf::Message& payload) const override;
  absl::StatusOr<std::string> Run(const bettercompute::agent::v1::Command& command,
                                  const google::protobuf::Message& payload,
                                  const std::atomic<bool>& stop) override;

 private:
  LogSources sources_;
  Upload upload_;
};

// node.reboot: hands the delay to `schedule`, which runs the configured reboot command once the
// delay has passed and the result has reached the gateway (node.cc), and answers with the time it
// is due (an earlier reboot still due is the one that happens: the node reboots once). The reboot
// command finds the reason and the command id in BCD_REBOOT_REASON and BCD_COMMAND_ID.
class NodeRebootHandler final : public CommandHandler {
 public:
  using Schedule = std::function<int64_t(std::chrono::seconds delay, std::string reason,
                                         std::string command_id)>;
  explicit NodeRebootHandler(Schedule schedule) : schedule_(std::move(schedule)) {}
  absl::Status Validate(const bettercompute::agent::v1::Command& command,
                        const google::protobuf::Message& payload) const override;
  absl::StatusOr<std::string> Run(const bettercompute::agent::v1::Command& command,
                                  const google::protobuf::Message& payload,
                                  const std::atomic<bool>& stop) override;

 private:
  Schedule schedule_;
};

}  // namespace bcd
