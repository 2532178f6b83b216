// Commands through a real session: every refusal code with its message, inventory.refresh end to
// end, dedup of a redelivered command, and cancel. The dev PKI signs as a control plane worker
// would.

#include <sstream>
#include <thread>

#include "daemon/join.h"
#include "daemon/node.h"
#include "gtest/gtest.h"
#include "pki/envelope.h"
#include "proto/signing_input.h"
#include "testing/dev_gateway.h"
#include "tests/unit/fake_root.h"

namespace bcd {
namespace {

namespace v1 = bettercompute::agent::v1;
using bcd::testing::DevGateway;
using bcd::testing::DevPki;
using bcd::testing::FakeRoot;
using std::chrono::seconds;

constexpr auto kWait = seconds(20);

class Commands : public ::testing::Test {
 protected:
  Commands() : pki_(*DevPki::Create(std::time(nullptr))) {
    gateway_ = *DevGateway::Start(pki_, {});
    root_.PopulateServer();
    Config config =
        *Config::Parse("gateway_url = \"https://127.0.0.1:" + std::to_string(gateway_->port()) +
                           "\"\ngateway_server_name = \"" + DevPki::kGatewayName +
                           "\"\ngateway_ca_spki_sha256 = \"" + pki_.ServingCaPinHex() +
                           "\"\nstate_dir = \"" + (dir_.path() / "state").string() + "\"\n",
                       "test.toml");
    JoinSpec spec{.evidence = gateway_->AddJoinToken("n-1"),
                  .now = [] { return static_cast<int64_t>(std::time(nullptr)); },
                  .sleep = [](seconds) {}};
    EXPECT_TRUE(JoinFleet(config, spec).ok());
    daemon_ = *NodeDaemon::Create(config, proto::Mode::kNode,
                                  {.inventory = {root_.path(), "x86_64", nullptr, 0},
                                   .now = [] { return static_cast<int64_t>(std::time(nullptr)); },
                                   .uniform01 = [] { return 0.01; },
                                   .log = &log_});
    runner_ = std::thread([this] { (void)daemon_->Run(); });
    EXPECT_TRUE(gateway_->WaitForReceived("n-1", 1, kWait));
  }
  ~Commands() override {
    daemon_->Stop();
    runner_.join();
  }

  v1::Command Make(const std::string& id, const std::string& kind) {
    v1::Command command;
    command.set_command_id(id);
    command.set_node_id("n-1");
    command.set_kind(kind);
    command.set_issued_at(static_cast<uint64_t>(std::time(nullptr)));
    command.set_expires_at(static_cast<uint64_t>(std::time(nullptr)) + 300);
    return command;
  }

  void Send(const v1::SignedCommand& command) {
    v1::ServerFrame frame;
    *frame.mutable_command() = command;
    ASSERT_TRUE(gateway_->Push("n-1", frame));
  }

  // The updates of `id` the gateway has seen so far, waiting until one is terminal.
  std::vector<v1::CommandUpdate> Updates(const std::string& id, std::size_t terminal_count = 1) {
    std::vector<v1::CommandUpdate> updates;
    auto deadline = std::chrono::steady_clock::now() + kWait;
    while (std::chrono::steady_clock::now() < deadline) {
      updates.clear();
      std::size_t terminal = 0;
      for (const auto& frame : gateway_->Received("n-1")) {
        if (!frame.has_command_update() || frame.command_update().command_id() != id) continue;
        updates.push_back(frame.command_update());
        v1::CommandState s = frame.command_update().state();
        terminal += s != v1::COMMAND_STATE_ACCEPTED && s != v1::COMMAND_STATE_RUNNING;
      }
      if (terminal >= terminal_count) break;
      gateway_->WaitForReceived("n-1", gateway_->Received("n-1").size() + 1,
                                std::chrono::milliseconds(200));
    }
    return updates;
  }

  void ExpectRejected(const std::string& id, v1::CommandCode code, const std::string& message) {
    std::vector<v1::CommandUpdate> updates = Updates(id);
    ASSERT_EQ(updates.size(), 1u) << id;
    EXPECT_EQ(updates[0].state(), v1::COMMAND_STATE_REJECTED) << id;
    EXPECT_EQ(v1::CommandCode_Name(updates[0].code()), v1::CommandCode_Name(code)) << id;
    EXPECT_EQ(updates[0].message(), message) << id;
  }

  FakeRoot dir_, root_;
  DevPki pki_;
  std::unique_ptr<DevGateway> gateway_;
  std::ostringstream log_text_;
  Logger log_{&log_text_, LogLevel::kInfo};
  std::unique_ptr<NodeDaemon> daemon_;
  std::thread runner_;
};

TEST_F(Commands, InventoryRefreshRunsAndSendsTheInventory) {
  Send(pki_.SignCommand(Make("c-1", "inventory.refresh")));
  std::vector<v1::CommandUpdate> updates = Updates("c-1");
  ASSERT_EQ(updates.size(), 3u);
  EXPECT_EQ(updates[0].state(), v1::COMMAND_STATE_ACCEPTED);
  EXPECT_EQ(updates[1].state(), v1::COMMAND_STATE_RUNNING);
  EXPECT_EQ(updates[2].state(), v1::COMMAND_STATE_SUCCEEDED);
  EXPECT_LT(updates[0].seq(), updates[1].seq());
  EXPECT_LT(updates[1].seq(), updates[2].seq());
  v1::InventoryRefreshResult result;
  ASSERT_TRUE(result.ParseFromString(updates[2].result()));
  EXPECT_GT(result.collected_at(), 0u);
  int inventories = 0;
  for (const auto& frame : gateway_->Received("n-1")) {
    if (frame.has_inventory()) {
      ++inventories;
      EXPECT_EQ(frame.inventory().hostname(), "gpu-node-7");
    }
  }
  EXPECT_EQ(inventories, 1);
}

TEST_F(Commands, ARedeliveredCommandGetsItsStoredResultAndDoesNotRunAgain) {
  v1::SignedCommand command = pki_.SignCommand(Make("c-1", "inventory.refresh"));
  Send(command);
  ASSERT_EQ(Updates("c-1").size(), 3u);
  Send(command);
  std::vector<v1::CommandUpdate> updates = Updates("c-1", 2);
  ASSERT_EQ(updates.size(), 4u);
  EXPECT_EQ(updates[3].state(), v1::COMMAND_STATE_SUCCEEDED);
  EXPECT_EQ(updates[3].result(), updates[2].result());
  int inventories = 0;
  for (const auto& frame : gateway_->Received("n-1")) inventories += frame.has_inventory();
  EXPECT_EQ(inventories, 1) << "the command ran once";
}

TEST_F(Commands, EachRefusalHasItsCode) {
  v1::Command other = Make("c-node", "inventory.refresh");
  other.set_node_id("n-2");
  Send(pki_.SignCommand(other));
  ExpectRejected("c-node", v1::COMMAND_CODE_WRONG_NODE,
                 "the command is for node \"n-2\", this is \"n-1\"");

  v1::Command expired = Make("c-exp", "inventory.refresh");
  expired.set_expires_at(1000);
  Send(pki_.SignCommand(expired));
  EXPECT_EQ(Updates("c-exp")[0].code(), v1::COMMAND_CODE_EXPIRED);

  Send(pki_.SignCommand(Make("c-unknown", "disk.format")));
  ExpectRejected("c-unknown", v1::COMMAND_CODE_UNSUPPORTED,
                 "kind \"disk.format\" is not supported by this node daemon");
  Send(pki_.SignCommand(Make("c-ramdisk", "diag.dcgm")));
  ExpectRejected("c-ramdisk", v1::COMMAND_CODE_UNSUPPORTED,
                 "kind \"diag.dcgm\" is not supported by this node daemon");

  Send(pki_.SignCommand(Make("c-unsigned", "logs.collect"), /*sign=*/false));
  ExpectRejected("c-unsigned", v1::COMMAND_CODE_UNSIGNED, "logs.collect commands must be signed");

  v1::SignedCommand forged = pki_.SignCommand(Make("c-forged", "logs.collect"));
  v1::Command changed = Make("c-forged", "logs.collect");
  changed.set_payload("\x0a\x03url");  // the body no longer matches the signature
  forged.set_body(changed.SerializeAsString());
  Send(forged);
  ExpectRejected("c-forged", v1::COMMAND_CODE_BAD_SIGNATURE,
                 "signature: the signature does not verify");

  v1::Command bad_payload = Make("c-payload", "inventory.refresh");
  bad_payload.set_payload("\xff\xff");
  Send(pki_.SignCommand(bad_payload));
  EXPECT_EQ(Updates("c-payload")[0].code(), v1::COMMAND_CODE_INVALID_PAYLOAD);
}

TEST_F(Commands, AnUnsignedCommandOfAKindThatNeedsNoSignatureRuns) {
  Send(pki_.SignCommand(Make("c-1", "inventory.refresh"), /*sign=*/false));
  EXPECT_EQ(Updates("c-1").back().state(), v1::COMMAND_STATE_SUCCEEDED);
}

}  // namespace
}  // namespace bcd
