#pragma once

// Site mode: what each datacenter site runs. Beyond the common kinds it drives the site's BMCs
// (bmc.*, over Redfish or IPMI, one lane per BMC address: bmc_kinds.h). The boot server and
// site.httpProxy come to this folder, each a handler registered in Attach.

#include "daemon/mode.h"
#include "modes/common/common_kinds.h"

namespace bcd {

struct SiteModeOptions {
  CommonSources sources;
  std::string ipmitool = "ipmitool";  // the program the IPMI kinds run
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
  std::vector<std::string> ConfigSections() const override { return {"node", "site"}; }
  absl::Status Attach(const ModeContext& context) override;
  void Detach() override {}

 private:
  SiteModeOptions options_;
};

}  // namespace bcd
