#pragma once

// Node mode: what every machine of the fleet runs. Beyond the common kinds it reboots the machine
// (node.reboot), takes the vps section's instances, answers them on the instance metadata service
// ([imds] listen) and dials them through tunnels (instance dial).

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/mode.h"
#include "modes/common/common_kinds.h"

namespace bcd {

class DesiredState;
class ImdsServer;
class RebootScheduler;

struct NodeModeOptions {
  CommonSources sources;
  // How long node.reboot waits for its result to reach the gateway before rebooting anyway.
  std::chrono::milliseconds reboot_result_wait = std::chrono::seconds(30);
};

class NodeMode final : public Mode {
 public:
  explicit NodeMode(NodeModeOptions options = {});
  ~NodeMode() override;

  proto::Mode id() const override { return proto::Mode::kNode; }
  bettercompute::common::v1::Role role() const override {
    return bettercompute::common::v1::ROLE_NODE;
  }
  std::vector<std::string> Capabilities(bool websocket) const override;
  // [imds]: the metadata service; [node]: node.reboot's command and the unit logs.collect reads.
  std::vector<std::string> ConfigSections() const override { return {"imds", "node"}; }
  absl::Status Attach(const ModeContext& context) override;
  void Detach() override;
  bool instance_dial() const override { return true; }
  std::optional<std::string> InstanceAddress(const std::string& instance_id) const override;

  // The metadata service's port, 0 when it does not run.
  uint16_t imds_port() const;

 private:
  NodeModeOptions options_;
  DesiredState* desired_ = nullptr;
  std::unique_ptr<RebootScheduler> reboot_;
  std::unique_ptr<ImdsServer> imds_;
};

}  // namespace bcd
