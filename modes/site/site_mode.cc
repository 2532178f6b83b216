#include "modes/site/site_mode.h"

namespace bcd {

std::vector<std::string> SiteMode::Capabilities(bool) const { return {}; }

absl::Status SiteMode::Attach(const ModeContext& context) {
  if (absl::Status s = RegisterInventoryRefresh(context, options_.sources); !s.ok()) return s;
  return RegisterLogsCollect(context, options_.sources);
}

}  // namespace bcd
