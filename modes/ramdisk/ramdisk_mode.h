#pragma once

// Ramdisk mode: what a bare-metal machine booted into the provisioning ramdisk runs. Today it runs
// inventory.refresh and sends ROLE_RAMDISK; the discovery join, disk.wipe, deploy.image,
// boot.kexec and diag.dcgm come to this folder, each a handler registered in Attach (until then
// the dispatcher refuses them saying this build does not run them yet).

#include "daemon/mode.h"
#include "modes/common/common_kinds.h"

namespace bcd {

struct RamdiskModeOptions {
  CommonSources sources;
};

class RamdiskMode final : public Mode {
 public:
  explicit RamdiskMode(RamdiskModeOptions options = {}) : options_(std::move(options)) {}

  proto::Mode id() const override { return proto::Mode::kRamdisk; }
  bettercompute::common::v1::Role role() const override {
    return bettercompute::common::v1::ROLE_RAMDISK;
  }
  std::vector<std::string> Capabilities(bool websocket) const override;
  // [node] log_unit: the journal unit logs.collect reads.
  std::vector<std::string> ConfigSections() const override { return {"node"}; }
  absl::Status Attach(const ModeContext& context) override;
  void Detach() override {}

 private:
  RamdiskModeOptions options_;
};

}  // namespace bcd
