// Commands through a real session: every refusal code with its message, inventory.refresh end to
// end, dedup of a redelivered command, and cancel. The dev PKI signs as a control plane worker
// would.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <future>
#include <set>
#include <sstream>
#include <thread>

#include "daemon/agent.h"
#include "daemon/dispatch/desired.h"
#include "daemon/identity/join.h"
#include "fmt/format.h"
#include "gtest/gtest.h"
#include "modes/node/node_mode.h"
#include "pki/envelope.h"
#include "pki/jwt.h"
#include "proto/absl_compat.h"
#include "proto/signing_input.h"
#include "testing/child_process.h"
#include "testing/dev_gateway.h"
#include "testing/upload_sink.h"
#include "testing/wait.h"
#include "tests/integration/joined_node.h"
#include "tests/unit/fake_root.h"
#include "transport/http_client.h"

namespace bcd {
namespace {

namespace v1 = bettercompute::agent::v1;
using bcd::testing::DevGateway;
using bcd::testing::DevPki;
using bcd::testing::FakeRoot;
using bcd::testing::JoinedNode;
using std::chrono::seconds;

constexpr auto kWait = seconds(20);

class Commands : public ::testing::Test {
 protected:
  Commands() {
    root_.PopulateServer();
    // Stand-ins for journalctl and dmesg, and a reboot command that leaves a mark.
    Script("journalctl", "echo \"journal of $5 since ${7:-always}\"");
    Script("dmesg", "echo '[    0.000000] Linux version 6.1.0'");
    Start();
  }
  ~Commands() override { Stop(); }

  void Script(const std::string& name, const std::string& body) {
    std::filesystem::path path = dir_.path() / name;
    std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
    std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  }

  void Start() {
    node_.Start(std::make_unique<NodeMode>(
                    NodeModeOptions{.sources = {.inventory = {root_.path(), "x86_64", nullptr, 0},
                                                .journalctl = (dir_.path() / "journalctl").string(),
                                                .dmesg = (dir_.path() / "dmesg").string()},
                                    .reboot_result_wait = reboot_result_wait_}),
                {.outbox_max_entries = outbox_max_entries_});
    int welcomes = gateway_->SessionNodes().size();
    EXPECT_TRUE(gateway_->WaitForWelcomes(welcomes + 1, kWait));
    EXPECT_TRUE(gateway_->WaitForReceived("n-1", 1, kWait));
  }
  void Stop() { node_.Stop(); }

  // Issued when the test began: made again, a command is the same bytes (a redelivery), never
  // a different command under its id because a second went by.
  v1::Command Make(const std::string& id, const std::string& kind) {
    return DevPki::MakeCommand(id, "n-1", kind, issued_at_);
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

  JoinedNode node_{{.extra_config =
                        [](const std::filesystem::path& dir) {
                          return "[node]\nreboot_command = [\"/bin/sh\", \"-c\", \"echo rebooted "
                                 "$BCD_COMMAND_ID >> " +
                                 (dir / "rebooted").string() + "\"]\n";
                        },
                    .log_level = LogLevel::kInfo}};
  FakeRoot& dir_ = node_.dir;
  FakeRoot root_;
  int64_t issued_at_ = std::time(nullptr);
  DevPki& pki_ = node_.pki;
  std::unique_ptr<DevGateway>& gateway_ = node_.gateway;
  std::ostringstream& log_text_ = node_.log_text;
  Logger& log_ = node_.log;
  std::unique_ptr<Config>& config_ = node_.config;
  std::size_t outbox_max_entries_ = 100000;
  std::chrono::milliseconds reboot_result_wait_ = seconds(30);
  std::unique_ptr<Agent>& daemon_ = node_.agent;
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
  Send(pki_.SignCommand(Make("c-driver", "driver.invoke")));
  ExpectRejected("c-driver", v1::COMMAND_CODE_UNSUPPORTED,
                 "kind \"driver.invoke\" is a node mode kind this build does not run yet");

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

std::string Hex(std::string_view bytes) {
  std::string out;
  for (unsigned char c : bytes) out += fmt::format("{:02x}", c);
  return out;
}

// What a shell command prints (the independent tools: tar, sha256sum).
std::string Shell(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  char buffer[4096];
  while (std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) out.append(buffer, n);
  pclose(pipe);
  return out;
}

TEST_F(Commands, LogsCollectUploadsABundleThatTarAndSha256sumAgreeWith) {
  testing::UploadSink sink;
  v1::LogsCollectPayload payload;
  payload.set_upload_url(sink.Url("/bucket/n-1.tar.gz?X-Amz-Signature=abc&X-Amz-Expires=600"));
  payload.add_journal_units("kubelet.service");
  payload.set_include_dmesg(true);
  payload.set_since(1700000000);
  (*payload.mutable_upload_headers())["x-amz-meta-node"] = "n-1";
  v1::Command command = Make("c-logs", "logs.collect");
  command.set_payload(payload.SerializeAsString());
  Send(pki_.SignCommand(command));
  std::vector<v1::CommandUpdate> updates = Updates("c-logs");
  ASSERT_EQ(updates.back().state(), v1::COMMAND_STATE_SUCCEEDED) << updates.back().message();
  v1::LogsCollectResult result;
  ASSERT_TRUE(result.ParseFromString(updates.back().result()));
  EXPECT_EQ(std::vector<std::string>(result.included().begin(), result.included().end()),
            (std::vector<std::string>{"bcd.log", "journal/kubelet.service.log", "dmesg.txt"}));
  EXPECT_FALSE(result.truncated());

  ASSERT_EQ(sink.requests().size(), 1u);
  testing::UploadSink::Request put = sink.requests()[0];
  EXPECT_EQ(put.method, "PUT");
  EXPECT_EQ(put.target, "/bucket/n-1.tar.gz?X-Amz-Signature=abc&X-Amz-Expires=600");
  EXPECT_EQ(put.headers["x-amz-meta-node"], "n-1");
  EXPECT_EQ(put.body.size(), result.size_bytes());
  std::filesystem::path bundle = dir_.path() / "bundle.tar.gz";
  std::ofstream(bundle, std::ios::binary) << put.body;
  EXPECT_EQ(Shell("sha256sum " + bundle.string()).substr(0, 64), Hex(result.sha256()));
  EXPECT_EQ(Shell("tar -tzf " + bundle.string()),
            "bcd.log\njournal/kubelet.service.log\ndmesg.txt\n");
  EXPECT_EQ(Shell("tar -xzOf " + bundle.string() + " bcd.log"),
            "journal of bcd.service since @1700000000\n");
  EXPECT_EQ(Shell("tar -xzOf " + bundle.string() + " dmesg.txt"),
            "[    0.000000] Linux version 6.1.0\n");
  for (const auto& entry : std::filesystem::directory_iterator(dir_.path() / "state")) {
    EXPECT_FALSE(entry.path().filename().string().starts_with(".logs-"))
        << entry.path() << ": the bundle is removed once uploaded";
  }
}

TEST_F(Commands, LogsCollectFailuresSayWhatWentWrong) {
  testing::UploadSink sink;
  sink.AnswerWith(403);
  v1::LogsCollectPayload payload;
  payload.set_upload_url(sink.Url("/bucket/x"));
  v1::Command command = Make("c-403", "logs.collect");
  command.set_payload(payload.SerializeAsString());
  Send(pki_.SignCommand(command));
  EXPECT_EQ(Updates("c-403").back().message(),
            "upload to 127.0.0.1: the server answered 403 sink said");

  payload.set_upload_url("http://192.0.2.1/bucket/x");
  command = Make("c-http", "logs.collect");
  command.set_payload(payload.SerializeAsString());
  Send(pki_.SignCommand(command));
  EXPECT_EQ(Updates("c-http").back().message(),
            "upload_url: plain http is allowed only to loopback addresses, and 192.0.2.1 resolves "
            "to 192.0.2.1");

  payload.set_upload_url(sink.Url("/bucket/x"));
  payload.add_journal_units("-rf /");
  command = Make("c-unit", "logs.collect");
  command.set_payload(payload.SerializeAsString());
  Send(pki_.SignCommand(command));
  // Refused before it is taken: REJECTED, never ACCEPTED or RUNNING.
  ExpectRejected("c-unit", v1::COMMAND_CODE_INVALID_PAYLOAD,
                 "journal unit \"-rf /\" is not a systemd unit name");

  // A budget smaller than the logs cuts them and says so.
  sink.AnswerWith(200);
  payload.clear_journal_units();
  payload.set_max_bytes(10);
  payload.set_include_dmesg(true);
  command = Make("c-small", "logs.collect");
  command.set_payload(payload.SerializeAsString());
  Send(pki_.SignCommand(command));
  v1::LogsCollectResult result;
  ASSERT_TRUE(result.ParseFromString(Updates("c-small").back().result()));
  EXPECT_TRUE(result.truncated());
  EXPECT_EQ(std::vector<std::string>(result.included().begin(), result.included().end()),
            (std::vector<std::string>{"bcd.log", "errors.txt"}));
}

// The lines the reboot command has appended so far, waiting (bounded) until there are `count`.
std::string WaitForLines(const std::filesystem::path& path, std::size_t count) {
  std::string text;
  bcd::testing::WaitFor(
      [&] {
        std::ifstream in(path);
        text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
        return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n')) >= count;
      },
      kWait);
  return text;
}

TEST_F(Commands, PlainHttpUploadsGoOnlyWhereEveryAddressIsLoopback) {
  testing::UploadSink sink;
  dir_.Write("bundle", "logs");
  auto put = [&](const std::string& host, std::vector<std::string> addresses) {
    return HttpPutFile({.url = fmt::format("http://{}:{}/b", host, sink.port()),
                        .file = dir_.path() / "bundle",
                        .resolve = [addresses](const std::string&) { return addresses; }});
  };
  // A name that looks like loopback and resolves elsewhere gets nothing in clear text.
  absl::Status spoofed = put("127.0.0.1.attacker.test", {"192.0.2.1"});
  EXPECT_EQ(spoofed.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(ToStd(spoofed.message())),
            "upload_url: plain http is allowed only to loopback addresses, and "
            "127.0.0.1.attacker.test resolves to 192.0.2.1");
  EXPECT_EQ(put("mixed.test", {"127.0.0.1", "192.0.2.1"}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(sink.requests().empty());
  // A name whose every address is loopback, and the resolved address is what is connected to.
  EXPECT_TRUE(put("sink.test", {"127.0.0.1"}).ok());
  ASSERT_EQ(sink.requests().size(), 1u);
  EXPECT_EQ(sink.requests()[0].headers.at("host"), fmt::format("sink.test:{}", sink.port()));
  EXPECT_TRUE(HttpPutFile({.url = fmt::format("http://localhost:{}/b", sink.port()),
                           .file = dir_.path() / "bundle"})
                  .ok());
}

TEST_F(Commands, CancelStopsAHangingUploadAndTheLaneMovesOn) {
  testing::UploadSink hanging, fine;
  hanging.Hang(true);
  auto collect = [&](const std::string& id, const testing::UploadSink& sink) {
    v1::LogsCollectPayload payload;
    payload.set_upload_url(sink.Url("/" + id));
    v1::Command command = Make(id, "logs.collect");
    command.set_payload(payload.SerializeAsString());
    Send(pki_.SignCommand(command));
  };
  collect("c-hangs", hanging);
  collect("c-next", fine);  // the same lane: waits behind it
  bcd::testing::WaitFor([&] { return !hanging.requests().empty(); }, kWait);
  ASSERT_EQ(hanging.requests().size(), 1u) << "the upload never reached the sink";
  v1::ServerFrame cancel;
  cancel.mutable_cancel_command()->set_command_id("c-hangs");
  cancel.mutable_cancel_command()->set_reason("operator");
  ASSERT_TRUE(gateway_->Push("n-1", cancel));
  EXPECT_EQ(Updates("c-hangs").back().state(), v1::COMMAND_STATE_CANCELLED);
  EXPECT_EQ(Updates("c-next").back().state(), v1::COMMAND_STATE_SUCCEEDED);
}

TEST_F(Commands, AStopIsNotHeldUpByAHangingUploadOrJournal) {
  Script("journalctl", "sleep 300");
  testing::UploadSink hanging;
  hanging.Hang(true);
  v1::LogsCollectPayload payload;
  payload.set_upload_url(hanging.Url("/x"));
  v1::Command command = Make("c-stuck", "logs.collect");
  command.set_payload(payload.SerializeAsString());
  Send(pki_.SignCommand(command));
  std::vector<v1::CommandUpdate> updates;
  bcd::testing::WaitFor(
      [&] {
        updates = Updates("c-stuck", 0);
        return updates.size() >= 2;
      },
      kWait);
  ASSERT_EQ(updates.back().state(), v1::COMMAND_STATE_RUNNING);
  std::promise<void> stopped;
  std::thread stop([&] {
    Stop();
    stopped.set_value();
  });
  // The journal stand-in sleeps 300 s: a stop that waited for it would not be done in 20.
  EXPECT_EQ(stopped.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready);
  stop.join();
}

TEST_F(Commands, EachNodeRebootReportsThenRunsTheRebootCommand) {
  v1::NodeRebootPayload payload;
  payload.set_reason("kernel update");
  v1::Command command = Make("c-reboot", "node.reboot");
  command.set_payload(payload.SerializeAsString());
  Send(pki_.SignCommand(command));
  std::vector<v1::CommandUpdate> updates = Updates("c-reboot");
  ASSERT_EQ(updates.back().state(), v1::COMMAND_STATE_SUCCEEDED) << updates.back().message();
  v1::NodeRebootResult result;
  ASSERT_TRUE(result.ParseFromString(updates.back().result()));
  EXPECT_NEAR(static_cast<double>(result.scheduled_at()), static_cast<double>(std::time(nullptr)),
              5);
  std::filesystem::path mark = dir_.path() / "rebooted";
  EXPECT_EQ(WaitForLines(mark, 1), "rebooted c-reboot\n");
  // The machine did not go down (the command is a stand-in): a later reboot reboots again.
  command.set_command_id("c-reboot-2");
  Send(pki_.SignCommand(command));
  EXPECT_EQ(Updates("c-reboot-2").back().state(), v1::COMMAND_STATE_SUCCEEDED);
  EXPECT_EQ(WaitForLines(mark, 2), "rebooted c-reboot\nrebooted c-reboot-2\n");
}

TEST_F(Commands, ARebootWhileOneIsDueIsThatOneAndAStopAbandonsIt) {
  v1::NodeRebootPayload payload;
  payload.set_delay_seconds(3600);
  v1::Command command = Make("c-later", "node.reboot");
  command.set_payload(payload.SerializeAsString());
  Send(pki_.SignCommand(command));
  v1::NodeRebootResult first, second;
  ASSERT_TRUE(first.ParseFromString(Updates("c-later").back().result()));
  payload.set_delay_seconds(10);
  command = Make("c-sooner", "node.reboot");
  command.set_payload(payload.SerializeAsString());
  Send(pki_.SignCommand(command));
  ASSERT_TRUE(second.ParseFromString(Updates("c-sooner").back().result()));
  EXPECT_EQ(second.scheduled_at(), first.scheduled_at()) << "the one already due";
  Stop();  // returns at once: the waiting reboot notices the stop
  EXPECT_FALSE(std::filesystem::exists(dir_.path() / "rebooted"));
  EXPECT_NE(log_.Text().find("event=node.reboot_abandoned reason=\"\" why=\"bcd stopped before "
                             "the reboot was due\""),
            std::string::npos)
      << log_.Text();
}

// The reboot waits for its result to be acknowledged (here never: an hour), and a daemon that
// stops meanwhile neither waits that out nor reboots the machine on its way out.
TEST_F(Commands, AStopEndsTheRebootsWaitForItsResultAndNothingReboots) {
  Stop();
  reboot_result_wait_ = std::chrono::hours(1);
  gateway_->WithholdAcks(true);
  Start();
  v1::NodeRebootPayload payload;
  v1::Command command = Make("c-now", "node.reboot");
  command.set_payload(payload.SerializeAsString());
  Send(pki_.SignCommand(command));
  ASSERT_EQ(Updates("c-now").back().state(), v1::COMMAND_STATE_SUCCEEDED);
  EXPECT_GT(daemon_->Snapshot().outbox_pending, 0u) << "the result is not acknowledged";
  // A stop that waited for the reboot's hour would not end within the bound (which is a bound on
  // a hang, not a figure: a stop takes milliseconds).
  std::promise<void> stopped;
  std::future<void> done = stopped.get_future();
  std::thread stopper([&] {
    Stop();
    stopped.set_value();
  });
  if (done.wait_for(kWait) != std::future_status::ready) {
    ADD_FAILURE() << "the stop waits for the reboot's result";
    std::fflush(nullptr);
    std::_Exit(1);  // the stopper is stuck for the hour: end here rather than hang
  }
  stopper.join();
  EXPECT_FALSE(std::filesystem::exists(dir_.path() / "rebooted"));
  EXPECT_NE(log_.Text().find("why=\"bcd stopped before the reboot command ran\""),
            std::string::npos)
      << log_.Text();
}

TEST_F(Commands, AFullOutboxSaysSoOnceAndResultsAreStillRemembered) {
  Stop();
  outbox_max_entries_ = 6;
  gateway_->WithholdAcks(true);
  Start();
  std::vector<v1::SignedCommand> sent;
  for (int i = 0; i < 3; ++i) {
    sent.push_back(pki_.SignCommand(Make("c-" + std::to_string(i), "inventory.refresh")));
    Send(sent.back());
  }
  EXPECT_TRUE(
      daemon_->WaitUntil([](const SessionSnapshot& s) { return s.outbox_pending == 6; }, kWait))
      << daemon_->Snapshot().outbox_pending;
  // All three ran (each sent its inventory, which does not go through the outbox), and the sixth
  // entry, the outbox.full event, reached the gateway.
  auto received = [&](const std::function<bool(const v1::AgentFrame&)>& match, long count) {
    auto deadline = std::chrono::steady_clock::now() + kWait;
    while (std::chrono::steady_clock::now() < deadline) {
      std::vector<v1::AgentFrame> frames = gateway_->Received("n-1");
      if (std::count_if(frames.begin(), frames.end(), match) >= count) return true;
      gateway_->WaitForReceived("n-1", frames.size() + 1, std::chrono::milliseconds(200));
    }
    return false;
  };
  ASSERT_TRUE(received([](const v1::AgentFrame& f) { return f.has_inventory(); }, 3));
  ASSERT_TRUE(received([](const v1::AgentFrame& f) { return f.has_event(); }, 1));
  int full = 0, updates = 0;
  std::set<std::string> finished;
  for (const auto& frame : gateway_->Received("n-1")) {
    if (frame.has_event() && frame.event().kind() == "outbox.full") {
      ++full;
      EXPECT_EQ(frame.event().message(),
                "the outbox is full: 5 entries wait for the gateway's Ack: updates and events "
                "after this one are lost until it drains");
    }
    updates += frame.has_command_update();
    if (frame.has_command_update() && frame.command_update().state() == v1::COMMAND_STATE_SUCCEEDED)
      finished.insert(frame.command_update().command_id());
  }
  EXPECT_EQ(full, 1);
  EXPECT_EQ(updates, 5);
  // A command whose result never reached the gateway: it ran all the same, and its result is
  // remembered. Redelivered, it is answered from memory (one terminal update, no new inventory),
  // not run again.
  auto lost = std::find_if(sent.begin(), sent.end(), [&](const v1::SignedCommand& c) {
    v1::Command command;
    command.ParseFromString(c.body());
    return !finished.contains(command.command_id());
  });
  ASSERT_NE(lost, sent.end()) << "every result arrived: nothing was lost to the full outbox";
  v1::Command command;
  command.ParseFromString(lost->body());
  gateway_->WithholdAcks(false);
  ASSERT_TRUE(
      daemon_->WaitUntil([](const SessionSnapshot& s) { return s.outbox_pending == 0; }, kWait));
  auto count = [&](const std::function<bool(const v1::AgentFrame&)>& match) {
    std::vector<v1::AgentFrame> frames = gateway_->Received("n-1");
    return std::count_if(frames.begin(), frames.end(), match);
  };
  auto of_command = [&](const v1::AgentFrame& f) {
    return f.has_command_update() && f.command_update().command_id() == command.command_id();
  };
  auto inventory = [](const v1::AgentFrame& f) { return f.has_inventory(); };
  long updates_before = count(of_command), inventories_before = count(inventory);
  Send(*lost);
  std::vector<v1::CommandUpdate> answer = Updates(command.command_id());
  ASSERT_FALSE(answer.empty());
  EXPECT_EQ(answer.back().state(), v1::COMMAND_STATE_SUCCEEDED);
  EXPECT_EQ(count(of_command), updates_before + 1) << "ACCEPTED and RUNNING again: it ran again";
  EXPECT_EQ(count(inventory), inventories_before) << "it collected the inventory again";
}

class Quorum : public Commands {
 protected:
  Quorum() {
    for (int i = 0; i < 3; ++i) approvers_.push_back(*pki::PrivateKey::Generate());
    // Two of three approve one command; a batch of 10 or more needs all three. One unbatched
    // destructive command an hour.
    v1::ServerFrame frame;
    *frame.mutable_trust() = pki_.SignedBundleWithApprovers(2, approvers_, 2, 1, 1, {{10, 3}});
    EXPECT_TRUE(gateway_->Push("n-1", frame));
    EXPECT_TRUE(
        daemon_->WaitUntil([](const SessionSnapshot& s) { return s.trust_version == 2; }, kWait));
  }
  v1::SignedCommand Reboot(const std::string& id, const std::vector<int>& approvals) {
    v1::SignedCommand command = pki_.SignCommand(Make(id, "node.reboot"));
    DevPki::Approve(&command, approvers_, approvals);
    return command;
  }
  std::vector<pki::PrivateKey> approvers_;
};

TEST_F(Quorum, UnbatchedDestructiveCommandsNeedTheThresholdAndTheHourlyLimit) {
  Send(Reboot("c-none", {}));
  ExpectRejected("c-none", v1::COMMAND_CODE_QUORUM, "0 of 2 approvals needed");
  Send(Reboot("c-one", {1}));
  ExpectRejected("c-one", v1::COMMAND_CODE_QUORUM, "1 of 2 approvals needed");
  Send(Reboot("c-twice", {1, 1}));
  ExpectRejected("c-twice", v1::COMMAND_CODE_QUORUM, "two approvals by the same key \"a1\"");
  v1::SignedCommand stolen = Reboot("c-stolen", {0, 1});
  v1::Command other = Make("c-stolen", "node.reboot");
  other.set_expires_at(other.expires_at() + 1);  // approvals were for another body
  stolen.set_body(other.SerializeAsString());
  *stolen.mutable_signature() = pki_.SignCommand(other).signature();
  Send(stolen);
  ExpectRejected("c-stolen", v1::COMMAND_CODE_BAD_SIGNATURE,
                 "approval by \"a0\" does not verify: the signature does not verify");
  Send(Reboot("c-ok", {0, 2}));
  EXPECT_EQ(Updates("c-ok").back().state(), v1::COMMAND_STATE_SUCCEEDED);
  Send(Reboot("c-next", {0, 1}));
  ExpectRejected("c-next", v1::COMMAND_CODE_RATE_LIMITED,
                 "1 unbatched destructive commands in the last hour, the limit is 1");
  // The count outlives a restart.
  Stop();
  Start();
  Send(Reboot("c-after", {0, 1}));
  ExpectRejected("c-after", v1::COMMAND_CODE_RATE_LIMITED,
                 "1 unbatched destructive commands in the last hour, the limit is 1");
}

TEST_F(Quorum, ABatchNeedsItsTiersThresholdAndAManifestNamingThisCommand) {
  std::vector<std::pair<std::string, std::string>> targets;
  for (int i = 0; i < 10; ++i)
    targets.emplace_back("n-" + std::to_string(i), "c-b" + std::to_string(i));
  auto batched = [&](const std::string& id, const std::vector<int>& approvals,
                     const std::string& manifest) {
    v1::Command command = Make(id, "node.reboot");
    command.set_batch_id("b-1");
    v1::SignedCommand signed_command = pki_.SignCommand(command);
    signed_command.set_batch_manifest(manifest);
    DevPki::Approve(&signed_command, approvers_, approvals);
    return signed_command;
  };
  std::string manifest = DevPki::Manifest("b-1", "node.reboot", targets);
  Send(batched("c-b1", {0, 1}, manifest));
  ExpectRejected("c-b1", v1::COMMAND_CODE_QUORUM,
                 "2 of 3 approvals needed for a batch of this size");
  Send(batched("c-b2", {0, 1, 2}, manifest));
  ExpectRejected("c-b2", v1::COMMAND_CODE_QUORUM,
                 "batch manifest does not name node \"n-1\" with command \"c-b2\"");
  Send(batched("c-b1", {0, 1, 2}, manifest));
  // c-b1 was answered already (REJECTED): a redelivery gets that answer, even with approvals.
  EXPECT_EQ(Updates("c-b1", 2).back().state(), v1::COMMAND_STATE_REJECTED);
  targets[1].second = "c-b3";  // a new batch manifest, naming this node with c-b3
  Send(batched("c-b3", {0, 1, 2}, DevPki::Manifest("b-1", "node.reboot", targets)));
  EXPECT_EQ(Updates("c-b3").back().state(), v1::COMMAND_STATE_SUCCEEDED);
  // Batched commands do not count against the unbatched hourly limit.
  Send(Reboot("c-unbatched", {0, 1}));
  EXPECT_EQ(Updates("c-unbatched").back().state(), v1::COMMAND_STATE_SUCCEEDED);
}

TEST_F(Commands, LanesTimeoutsCancelAndDuplicatesThroughASession) {
  // journalctl stand-in: "slow.service" takes 3 s.
  Script("journalctl", "if [ \"$5\" = slow.service ]; then sleep 3; fi; echo \"journal of $5\"");
  testing::UploadSink sink;
  auto logs = [&](const std::string& id, const std::string& unit, uint32_t timeout) {
    v1::LogsCollectPayload payload;
    payload.set_upload_url(sink.Url("/" + id));
    payload.add_journal_units(unit);
    v1::Command command = Make(id, "logs.collect");
    command.set_payload(payload.SerializeAsString());
    command.set_timeout_seconds(timeout);
    return pki_.SignCommand(command);
  };
  v1::SignedCommand slow_command = logs("c-slow", "slow.service", 0);
  Send(slow_command);
  Send(logs("c-queued", "fast.service", 0));  // the bulk lane runs one at a time: it waits
  Send(logs("c-slow", "other.service", 0));   // same id, different command
  std::vector<v1::CommandUpdate> slow = Updates("c-slow");
  ASSERT_EQ(slow.back().state(), v1::COMMAND_STATE_REJECTED);
  EXPECT_EQ(slow.back().code(), v1::COMMAND_CODE_DUPLICATE);
  EXPECT_EQ(slow.back().message(), "a different command with this id is in hand");
  // A redelivery of the command in hand (the same bytes) is not answered with that refusal.
  Send(slow_command);
  // Another lane is not held up by the bulk lane.
  Send(pki_.SignCommand(Make("c-inv", "inventory.refresh")));
  EXPECT_EQ(Updates("c-inv").back().state(), v1::COMMAND_STATE_SUCCEEDED);
  v1::ServerFrame cancel;
  cancel.mutable_cancel_command()->set_command_id("c-queued");
  cancel.mutable_cancel_command()->set_reason("operator changed their mind");
  ASSERT_TRUE(gateway_->Push("n-1", cancel));
  std::vector<v1::CommandUpdate> queued = Updates("c-queued");
  EXPECT_EQ(queued.back().state(), v1::COMMAND_STATE_CANCELLED);
  EXPECT_EQ(queued.back().message(), "operator changed their mind");
  EXPECT_EQ(queued.size(), 2u) << "ACCEPTED, then CANCELLED: it never ran";
  // The slow one finishes (its first terminal update: the DUPLICATE rejection was about the other).
  slow = Updates("c-slow", 2);
  EXPECT_EQ(slow.back().state(), v1::COMMAND_STATE_SUCCEEDED);
  // A timeout counts from when the command runs, and stops it.
  Send(logs("c-late", "slow.service", 1));
  std::vector<v1::CommandUpdate> late = Updates("c-late");
  EXPECT_EQ(late.back().state(), v1::COMMAND_STATE_TIMED_OUT);
  EXPECT_EQ(late.back().message(), "the command ran past its timeout");
}

v1::NodeSpec Spec(uint64_t generation, const std::string& node_id = "n-1") {
  v1::NodeSpec spec;
  spec.set_generation(generation);
  spec.set_node_id(node_id);
  return spec;
}

class DesiredStates : public Commands {
 protected:
  void Send(const v1::SignedSpec& spec) {
    v1::ServerFrame frame;
    *frame.mutable_desired_state() = spec;
    ASSERT_TRUE(gateway_->Push("n-1", frame));
  }
  // The SpecAcks the gateway has seen, waiting until there are `count`.
  std::vector<v1::SpecAck> Acks(std::size_t count) {
    std::vector<v1::SpecAck> acks;
    bcd::testing::WaitFor(
        [&] {
          acks.clear();
          for (const auto& frame : gateway_->Received("n-1"))
            if (frame.has_spec_ack()) acks.push_back(frame.spec_ack());
          return acks.size() >= count;
        },
        kWait);
    return acks;
  }
  static std::string Sections(const google::protobuf::RepeatedPtrField<v1::SectionStatus>& all) {
    std::string out;
    for (const v1::SectionStatus& s : all)
      out += s.name() + "=" + v1::SectionState_Name(s.state()) + " ";
    return out;
  }
};

TEST_F(DesiredStates, ANewerSpecIsAppliedPersistedAndReported) {
  v1::NodeSpec spec = Spec(3);
  spec.mutable_daemon()->set_log_level("debug");
  spec.mutable_daemon()->set_status_interval_seconds(60);
  std::string jwks = pki::JwksOf(pki::PrivateKey::Generate()->Public(), "t-1");
  spec.mutable_access()->set_tunnel_jwks(jwks);
  spec.mutable_vps()->add_instances()->set_instance_id("vm-1");
  Send(pki_.SignSpec(spec));
  EXPECT_EQ(log_.level(), LogLevel::kInfo);
  std::vector<v1::SpecAck> acks = Acks(1);
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_EQ(acks[0].state(), v1::SPEC_ACK_STATE_APPLIED);
  EXPECT_EQ(acks[0].generation(), 3u);
  EXPECT_EQ(Sections(acks[0].sections()),
            "daemon=SECTION_STATE_APPLIED access=SECTION_STATE_APPLIED "
            "vps=SECTION_STATE_UNSUPPORTED ");
  EXPECT_EQ(acks[0].sections(2).message(),
            "instances are not created, started or stopped by this build (image, vcpus, memory "
            "and power_state are not acted on); their ids and addresses are taken: instance-tcp "
            "tunnels reach them");
  EXPECT_EQ(daemon_->desired().tunnel_jwks(), jwks);
  // A StatusReport follows the change.
  std::optional<v1::StatusReport> status;
  bcd::testing::WaitFor(
      [&] {
        for (const auto& frame : gateway_->Received("n-1"))
          if (frame.has_status() && frame.status().applied_generation() == 3)
            status = frame.status();
        return status.has_value();
      },
      kWait);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->sections_size(), 3);

  // After a restart the spec is applied again and Hello says which generation.
  Stop();
  log_.set_level(LogLevel::kInfo);
  Start();
  EXPECT_EQ(gateway_->LastHello("n-1")->applied_generation(), 3u);
  EXPECT_EQ(daemon_->desired().tunnel_jwks(), jwks);
  EXPECT_EQ(daemon_->desired().sections().size(), 3u);
  EXPECT_EQ(log_.level(), LogLevel::kDebug) << "the daemon section's log level took effect";
}

TEST_F(DesiredStates, EachRefusalHasItsCode) {
  Send(pki_.SignSpec(Spec(5)));
  ASSERT_EQ(Acks(1).size(), 1u);
  Send(pki_.SignSpec(Spec(5)));
  Send(pki_.SignSpec(Spec(4)));
  Send(pki_.SignSpec(Spec(6, "n-2")));
  Send(pki_.SignSpec(Spec(7), /*sign=*/false));
  v1::SignedSpec forged = pki_.SignSpec(Spec(8));
  forged.set_body(Spec(9).SerializeAsString());
  Send(forged);
  v1::SignedSpec garbage;
  garbage.set_body("\xff\xff");
  Send(garbage);
  std::vector<v1::SpecAck> acks = Acks(7);
  ASSERT_EQ(acks.size(), 7u);
  std::vector<std::pair<std::string, std::string>> got;
  for (std::size_t i = 1; i < acks.size(); ++i) {
    EXPECT_EQ(acks[i].state(), v1::SPEC_ACK_STATE_REJECTED);
    got.emplace_back(acks[i].code(), acks[i].message());
  }
  EXPECT_EQ(got[0],
            std::make_pair(std::string("STALE"),
                           std::string("spec generation 5 is not newer than the applied 5")));
  EXPECT_EQ(got[1].first, "STALE");
  EXPECT_EQ(got[2],
            std::make_pair(std::string("WRONG_NODE"),
                           std::string("spec generation 6 is for node \"n-2\", this is \"n-1\"")));
  EXPECT_EQ(got[3], std::make_pair(std::string("UNSIGNED"),
                                   std::string("spec generation 7 is not signed")));
  EXPECT_EQ(
      got[4],
      std::make_pair(std::string("BAD_SIGNATURE"),
                     std::string("spec generation 9: signature: the signature does not verify")));
  EXPECT_EQ(got[5].first, "INVALID");
  EXPECT_EQ(daemon_->desired().applied_generation(), 5u);
}

TEST_F(DesiredStates, SectionsThisBuildCannotTakeAreReportedNotDropped) {
  v1::NodeSpec spec = Spec(2);
  spec.mutable_access()->set_tunnel_jwks("{\"keys\": [{\"kid\": \"k\", \"kty\": \"RSA\"}]}");
  spec.mutable_daemon()->set_log_level("loud");
  spec.mutable_k8s_join()->set_api_server("https://k8s.example:6443");
  // A section from a newer control plane: field 40 of NodeSpec, unknown to this build.
  std::string body = spec.SerializeAsString() + std::string("\xc2\x02\x02\x08\x01", 5);
  v1::SignedSpec signed_spec = pki_.SignSpec(spec);
  v1::NodeSpec with_unknown;
  ASSERT_TRUE(with_unknown.ParseFromString(body));
  signed_spec = pki_.SignSpec(with_unknown);
  Send(signed_spec);
  std::vector<v1::SpecAck> acks = Acks(1);
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_EQ(Sections(acks[0].sections()),
            "daemon=SECTION_STATE_FAILED access=SECTION_STATE_FAILED "
            "k8s_join=SECTION_STATE_UNSUPPORTED field 40=SECTION_STATE_UNSUPPORTED ");
  EXPECT_EQ(acks[0].sections(0).message(),
            "log_level \"loud\" is not one of debug, info, warn, error");
  EXPECT_EQ(acks[0].sections(1).message(), "tunnel_jwks: JWKS key \"k\" is not an EC P-256 key");
  EXPECT_EQ(acks[0].sections(3).message(),
            "a section this build does not know (NodeSpec field 40)");
}

}  // namespace
}  // namespace bcd
