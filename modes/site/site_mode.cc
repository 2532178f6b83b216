#include "modes/site/site_mode.h"

#include "modes/site/bmc_kinds.h"

namespace bcd {

std::vector<std::string> SiteMode::Capabilities(bool) const { return {}; }

absl::Status SiteMode::Attach(const ModeContext& context) {
  if (absl::Status s = RegisterInventoryRefresh(context, options_.sources); !s.ok()) return s;
  if (absl::Status s = RegisterLogsCollect(context, options_.sources); !s.ok()) return s;
  const Config::Site& site = context.config->site();
  return RegisterBmcKinds(context, {.ca_file = site.bmc_ca_file,
                                    .tls_unverified = site.bmc_tls_unverified,
                                    .redfish_port = site.bmc_redfish_port,
                                    .ipmi_port = site.bmc_ipmi_port,
                                    .ipmitool = options_.ipmitool});
}

}  // namespace bcd
