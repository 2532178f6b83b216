#pragma once

// The kinds several modes run, registered by each mode that the kind table gives them to:
// inventory.refresh (every mode) and logs.collect (node and site).

#include <string>

#include "absl/status/status.h"
#include "daemon/mode.h"
#include "modes/common/inventory.h"

namespace bcd {

// Where those kinds read from; tests point them at a fake root and scripts.
struct CommonSources {
  InventorySources inventory;  // root, architecture, runner
  std::string journalctl = "journalctl";
  std::string dmesg = "dmesg";
};

// inventory.refresh: collects the claims again and sends them as an `inventory` frame.
absl::Status RegisterInventoryRefresh(const ModeContext& context, const CommonSources& sources);
// logs.collect: bcd's journal, the units asked for and dmesg, uploaded as a .tar.gz.
absl::Status RegisterLogsCollect(const ModeContext& context, const CommonSources& sources);

}  // namespace bcd
