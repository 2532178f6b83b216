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
