#include "modes/node/node_mode.h"

#include "daemon/dispatch/desired.h"
#include "daemon/secrets/secrets.h"
#include "daemon/session/session.h"
#include "fmt/format.h"
#include "modes/node/imds.h"
#include "modes/node/reboot.h"
#include "proto/absl_compat.h"

namespace bcd {

namespace v1 = bettercompute::agent::v1;

NodeMode::NodeMode(NodeModeOptions options) : options_(std::move(options)) {}

NodeMode::~NodeMode() { Detach(); }

std::vector<std::string> NodeMode::Capabilities(bool websocket) const {
  std::vector<std::string> capabilities;
  if (!websocket) capabilities.push_back("tunnel.instance-dial");
  capabilities.push_back("workload-token");  // for the metadata service's instances
  return capabilities;
}

absl::Status NodeMode::Attach(const ModeContext& context) {
  desired_ = context.desired;
  if (absl::Status s = RegisterInventoryRefresh(context, options_.sources); !s.ok()) return s;
  if (absl::Status s = RegisterLogsCollect(context, options_.sources); !s.ok()) return s;
  reboot_ = std::make_unique<RebootScheduler>(context.config->reboot_command(),
                                              options_.reboot_result_wait, context.engine,
                                              context.now, context.log);
  RebootScheduler* reboot = reboot_.get();
  if (absl::Status s = context.dispatcher->Register(
          "node.reboot",
          std::make_unique<NodeRebootHandler>(
              [reboot](std::chrono::seconds delay, std::string reason, std::string command_id) {
                return reboot->Schedule(delay, std::move(reason), std::move(command_id));
              }));
      !s.ok()) {
    return s;
  }
  // Not APPLIED: bcd takes the instances' addresses, but creates, starts and stops nothing.
  context.desired->Register(
      "vps", [imds = context.config->imds_listen().has_value()](const v1::NodeSpec&) {
        return absl::UnimplementedError(fmt::format(
            "instances are not created, started or stopped by this build (image, vcpus, memory "
            "and power_state are not acted on); their ids and addresses are taken: {}instance-tcp "
            "tunnels reach them",
            imds ? "the metadata service answers them and " : ""));
      });
  if (!context.config->imds_listen()) return absl::OkStatus();
  DesiredState* desired = context.desired;
  SecretClient* secrets = context.secrets;
  absl::StatusOr<std::unique_ptr<ImdsServer>> imds = ImdsServer::Start(
      {.host = context.config->imds_listen()->host,
       .port = context.config->imds_listen()->port,
       .instances =
           [desired] {
             v1::NodeSpec spec = desired->applied();
             return std::vector<v1::VpsInstance>(spec.vps().instances().begin(),
                                                 spec.vps().instances().end());
           },
       .user_data =
           [secrets](const v1::VpsInstance& instance) {
             return secrets->Resolve(instance.user_data_ref(),
                                     {.allocation_id = instance.allocation_id()});
           },
       .token =
           [secrets](const v1::VpsInstance& instance, const std::string& audience) {
             return secrets->WorkloadToken(instance.instance_id(), audience);
           },
       .now = context.now,
       .metrics = context.metrics},
      context.log);
  if (!imds.ok()) {
    // The node goes on without it; the gateway hears why.
    std::string why(ToStd(imds.status().message()));
    context.log->Error("imds.unavailable", {{"error", why}});
    (void)context.engine->Emit(v1::SEVERITY_ERROR, "imds.unavailable", why);
  } else {
    imds_ = *std::move(imds);
  }
  return absl::OkStatus();
}

void NodeMode::Detach() {
  imds_.reset();
  if (reboot_) reboot_->Stop();
}

std::optional<std::string> NodeMode::InstanceAddress(const std::string& instance_id) const {
  if (desired_ == nullptr) return std::nullopt;
  v1::NodeSpec spec = desired_->applied();  // held: the loop reads into it
  for (const v1::VpsInstance& instance : spec.vps().instances()) {
    if (instance.instance_id() == instance_id && !instance.address().empty()) {
      return instance.address();
    }
  }
  return std::nullopt;
}

uint16_t NodeMode::imds_port() const { return imds_ ? imds_->port() : 0; }

}  // namespace bcd
