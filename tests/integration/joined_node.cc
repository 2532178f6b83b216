#include "tests/integration/joined_node.h"

#include "daemon/identity/join.h"
#include "gtest/gtest.h"

namespace bcd::testing {

JoinedNode::JoinedNode(Options options)
    : pki(*DevPki::Create(options.now())), options_(std::move(options)) {
  log.set_level(options_.log_level);
  gateway = *DevGateway::Start(pki, options_.gateway);
  std::string extra = options_.extra_config ? options_.extra_config(dir.path()) : "";
  absl::StatusOr<Config> parsed =
      Config::Parse(gateway->ConfigToml(dir.path() / "state") + extra, "test.toml");
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  config = std::make_unique<Config>(*std::move(parsed));
  JoinSpec spec{.evidence = gateway->AddJoinToken(options_.node_id),
                .now = options_.now,
                .sleep = [](std::chrono::seconds) {}};
  absl::StatusOr<Identity> joined = JoinFleet(*config, spec);
  EXPECT_TRUE(joined.ok()) << joined.status();
}

JoinedNode::~JoinedNode() { Stop(); }

void JoinedNode::SendCommand(const std::string& id, const std::string& kind,
                             const google::protobuf::Message& payload, const std::string& workflow,
                             const std::string& step, uint32_t timeout_seconds) {
  bettercompute::agent::v1::Command command =
      DevPki::MakeCommand(id, options_.node_id, kind, options_.now());
  command.set_workflow_id(workflow);
  command.set_step_id(step);
  command.set_timeout_seconds(timeout_seconds);
  command.set_payload(payload.SerializeAsString());
  bettercompute::agent::v1::ServerFrame frame;
  *frame.mutable_command() = pki.SignCommand(command);
  EXPECT_TRUE(gateway->Push(options_.node_id, frame)) << id;
}

bettercompute::agent::v1::CommandUpdate JoinedNode::WaitTerminal(const std::string& id,
                                                                 std::chrono::seconds wait) {
  namespace v1 = bettercompute::agent::v1;
  auto deadline = std::chrono::steady_clock::now() + wait;
  while (std::chrono::steady_clock::now() < deadline) {
    for (const auto& frame : gateway->Received(options_.node_id)) {
      if (!frame.has_command_update() || frame.command_update().command_id() != id) continue;
      v1::CommandState s = frame.command_update().state();
      if (s != v1::COMMAND_STATE_ACCEPTED && s != v1::COMMAND_STATE_RUNNING)
        return frame.command_update();
    }
    gateway->WaitForReceived(options_.node_id, gateway->Received(options_.node_id).size() + 1,
                             std::chrono::milliseconds(200));
  }
  ADD_FAILURE() << id << " did not end";
  return {};
}

void JoinedNode::Start(std::unique_ptr<Mode> mode, AgentEnv env) {
  if (!env.now) env.now = options_.now;
  if (!env.uniform01) env.uniform01 = [] { return 0.01; };
  if (env.log == nullptr) env.log = &log;
  absl::StatusOr<std::unique_ptr<Agent>> created = Agent::Create(*config, std::move(mode), env);
  ASSERT_TRUE(created.ok()) << created.status();
  agent = *std::move(created);
  runner_ = std::thread([this] { (void)agent->Run(); });
}

void JoinedNode::Stop() {
  if (!agent) return;
  agent->Stop();
  runner_.join();
  agent.reset();
}

}  // namespace bcd::testing
