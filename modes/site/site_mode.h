#pragma once

// Site mode: what each datacenter site runs. Beyond the common kinds it drives the site's BMCs
// (bmc.*, over Redfish or IPMI, one lane per BMC address: bmc_kinds.h) and boots bare metal
// (boot.prepareRamdisk and boot.cleanUp feeding the boot server of [boot]: boot_kinds.h).
// and makes single HTTP requests into the site for the control plane (site.httpProxy:
// http_proxy.h).

#include "daemon/mode.h"
#include "modes/common/common_kinds.h"
#include "modes/site/boot_kinds.h"

namespace bcd {

struct SiteModeOptions {
  CommonSources sources;
  std::string ipmitool = "ipmitool";  // the program the IPMI kinds run
  // How site.httpProxy resolves names (tests); the system's resolver when unset.
  std::function<std::vector<std::string>(const std::string& host)> resolve;
};

class SiteMode final : public Mode {
 public:
  explicit SiteMode(SiteModeOptions options = {}) : options_(std::move(options)) {}

  proto::Mode id() const override { return proto::Mode::kSite; }
  bettercompute::common::v1::Role role() const override {
    return bettercompute::common::v1::ROLE_SITE;
  }
  std::vector<std::string> Capabilities(bool websocket) const override;
  // [node] log_unit: the journal unit logs.collect reads (site agents run logs.collect too);
  // [site]: how the BMCs are reached.
  // [boot]: the boot server.
  std::vector<std::string> ConfigSections() const override { return {"node", "site", "boot"}; }
  absl::Status Attach(const ModeContext& context) override;
  void Detach() override { boot_.reset(); }
  // The boot server's port (0 when none runs): tests listen on port 0.
  uint16_t boot_port() const { return boot_ ? boot_->port() : 0; }

 private:
  SiteModeOptions options_;
  std::unique_ptr<BootService> boot_;
};

}  // namespace bcd
