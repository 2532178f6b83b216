#include "modes/site/site_mode.h"

#include "modes/site/bmc_kinds.h"
#include "modes/site/boot_kinds.h"
#include "modes/site/http_proxy.h"

namespace bcd {

std::vector<std::string> SiteMode::Capabilities(bool) const { return {}; }

absl::Status SiteMode::Attach(const ModeContext& context) {
  if (absl::Status s = RegisterInventoryRefresh(context, options_.sources); !s.ok()) return s;
  if (absl::Status s = RegisterLogsCollect(context, options_.sources); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<BootService>> boot = StartBoot(context);
  if (!boot.ok()) return boot.status();
  boot_ = *std::move(boot);
  const Config::Site& site = context.config->site();
  if (absl::Status s = RegisterHttpProxy(context, {.allow = site.http_proxy_allow,
                                                   .ca_file = site.http_proxy_ca_file,
                                                   .resolve = options_.resolve});
      !s.ok()) {
    return s;
  }
  return RegisterBmcKinds(context, {.ca_file = site.bmc_ca_file,
                                    .tls_unverified = site.bmc_tls_unverified,
                                    .redfish_port = site.bmc_redfish_port,
                                    .ipmi_port = site.bmc_ipmi_port,
                                    .ipmitool = options_.ipmitool});
}

}  // namespace bcd
