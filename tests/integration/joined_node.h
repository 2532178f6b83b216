#pragma once

// The starting point most integration suites share: a dev PKI and gateway on loopback, a node
// joined to it in a temporary state dir, and its agent running on a thread of the test. A suite's
// fixture holds one and names its parts; what differs between suites (extra config, the mode and
// its options, the environment) comes in as arguments.

#include <ctime>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "bettercompute/agent/v1/commands.pb.h"
#include "config/config.h"
#include "daemon/agent.h"
#include "daemon/mode.h"
#include "google/protobuf/message.h"
#include "testing/dev_gateway.h"
#include "testing/dev_pki.h"
#include "tests/unit/fake_root.h"

namespace bcd::testing {

inline int64_t SystemNow() { return static_cast<int64_t>(std::time(nullptr)); }

class JoinedNode {
 public:
  struct Options {
    std::string node_id = "n-1";
    // TOML after the gateway's lines (a [node] or [imds] table), given the node's directory.
    std::function<std::string(const std::filesystem::path& dir)> extra_config;
    LogLevel log_level = LogLevel::kDebug;
    UnixClock now = SystemNow;
    DevGatewayOptions gateway;
  };

  // Starts the gateway and joins (the join's failure fails the test that made it).
  explicit JoinedNode(Options options);
  // Stops the agent if it runs.
  ~JoinedNode();
  JoinedNode(const JoinedNode&) = delete;
  JoinedNode& operator=(const JoinedNode&) = delete;

  // Creates the agent with `mode` and runs it on a thread. `env` without a clock, log or
  // uniform01 gets the node's clock, the node's log and a fixed jitter.
  void Start(std::unique_ptr<Mode> mode, AgentEnv env = {});
  // Stops the agent and waits for its thread; nothing when none runs.
  void Stop();

  // Sends `kind` with `payload`, signed by the dev PKI's worker, to the node, bound to `workflow`
  // and `step`; then waits for its terminal update (a failed test when none comes in `wait`).
  void SendCommand(const std::string& id, const std::string& kind,
                   const google::protobuf::Message& payload, const std::string& workflow,
                   const std::string& step, uint32_t timeout_seconds = 0);
  bettercompute::agent::v1::CommandUpdate WaitTerminal(
      const std::string& id, std::chrono::seconds wait = std::chrono::seconds(60));

  // What the log said so far.
  std::string LogText() const { return log_text.str(); }

  // In construction order, the members tests use directly.
  FakeRoot dir;
  DevPki pki;
  std::unique_ptr<DevGateway> gateway;
  std::unique_ptr<Config> config;
  std::ostringstream log_text;
  Logger log{&log_text, LogLevel::kDebug};  // at Options::log_level
  std::unique_ptr<Agent> agent;

 private:
  Options options_;
  std::thread runner_;
};

}  // namespace bcd::testing
