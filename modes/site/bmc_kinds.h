#pragma once

// The bmc.* kinds: power on, off, cycle and status, the boot device, a new BMC password. Each
// command fetches the BMC's credential (a secret bound to its workflow step), opens one session
// with the protocol the target names (AUTO: Redfish, then IPMI where Redfish is not served), acts,
// reads the state back, closes. Commands on one BMC run one at a time (the per-BMC lane, keyed by
// address); different BMCs side by side.

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/mode.h"

namespace bcd {

struct BmcOptions {
  // [site]: how a Redfish certificate is trusted when the target pins none: a CA file, or no
  // check for the addresses listed by name; otherwise the command is refused.
  std::string ca_file;
  std::vector<std::string> tls_unverified;
  uint16_t redfish_port = 443;
  uint16_t ipmi_port = 623;
  std::string ipmitool = "ipmitool";
  std::chrono::milliseconds exchange_timeout{std::chrono::seconds(20)};
};

// Registers the six bmc.* handlers. Needs context.secrets and a state_dir (the 0700 directory
// "bmc" under it holds the file a new IPMI password goes through, for as long as ipmitool runs).
absl::Status RegisterBmcKinds(const ModeContext& context, const BmcOptions& options);

}  // namespace bcd
