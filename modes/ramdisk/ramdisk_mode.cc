#include "modes/ramdisk/ramdisk_mode.h"

namespace bcd {

std::vector<std::string> RamdiskMode::Capabilities(bool) const { return {}; }

absl::Status RamdiskMode::Attach(const ModeContext& context) {
  return RegisterInventoryRefresh(context, options_.sources);
}

}  // namespace bcd
