#include "app/modes.h"

#include "modes/node/node_mode.h"
#include "modes/ramdisk/ramdisk_mode.h"
#include "modes/site/site_mode.h"

namespace bcd {

std::unique_ptr<Mode> MakeMode(proto::Mode mode, const CommonSources& sources) {
  switch (mode) {
    case proto::Mode::kNode:
      return std::make_unique<NodeMode>(NodeModeOptions{.sources = sources});
    case proto::Mode::kSite:
      return std::make_unique<SiteMode>(SiteModeOptions{.sources = sources});
    case proto::Mode::kRamdisk:
      return std::make_unique<RamdiskMode>(RamdiskModeOptions{.sources = sources});
  }
  return nullptr;
}

}  // namespace bcd
