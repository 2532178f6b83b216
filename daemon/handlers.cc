#include "daemon/handlers.h"

#include <ctime>

namespace bcd {

absl::StatusOr<std::string> InventoryRefreshHandler::Run(const bettercompute::agent::v1::Command&,
                                                         const google::protobuf::Message&,
                                                         const std::atomic<bool>&) {
  InventorySources sources = sources_;
  sources.now = static_cast<uint64_t>(std::time(nullptr));
  bettercompute::common::v1::HardwareClaims claims = CollectInventory(sources);
  send_(claims);
  bettercompute::agent::v1::InventoryRefreshResult result;
  result.set_collected_at(claims.collected_at());
  return result.SerializeAsString();
}

}  // namespace bcd
