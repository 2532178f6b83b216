#include "modes/common/common_kinds.h"

#include <memory>

#include "daemon/dispatch/dispatcher.h"
#include "daemon/session/session.h"
#include "modes/common/handlers.h"
#include "transport/http_client.h"

namespace bcd {

absl::Status RegisterInventoryRefresh(const ModeContext& context, const CommonSources& sources) {
  SessionEngine* engine = context.engine;
  return context.dispatcher->Register(
      "inventory.refresh", std::make_unique<InventoryRefreshHandler>(
                               sources.inventory, context.now,
                               [engine](const bettercompute::common::v1::HardwareClaims& claims) {
                                 bettercompute::agent::v1::AgentFrame frame;
                                 *frame.mutable_inventory() = claims;
                                 engine->Send(frame);
                               }));
}

absl::Status RegisterLogsCollect(const ModeContext& context, const CommonSources& sources) {
  return context.dispatcher->Register(
      "logs.collect", std::make_unique<LogsCollectHandler>(
                          LogSources{.journalctl = sources.journalctl,
                                     .dmesg = sources.dmesg,
                                     .bcd_unit = context.config->log_unit(),
                                     .work_dir = context.state_dir,
                                     .now = context.now},
                          [](const UploadRequest& request) { return HttpPutFile(request); }));
}

}  // namespace bcd
