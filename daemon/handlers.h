#pragma once

// The node mode's command handlers.

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

}  // namespace bcd
