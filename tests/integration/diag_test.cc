// The diagnostics listener against the dev stack: /metrics read by parsers nobody here wrote
// (Prometheus's own promtool, and parse-prometheus-text-format on npm), its values moving as the
// node runs commands, renews, opens tunnels and loses its session; /readyz and /healthz; curl as
// the client.

#include <map>
#include <optional>
#include <string>

#include "base/version.h"
#include "daemon/agent.h"
#include "daemon/dispatch/desired.h"
#include "fmt/format.h"
#include "gtest/gtest.h"
#include "modes/node/node_mode.h"
#include "nlohmann/json.hpp"
#include "testing/child_process.h"
#include "testing/dev_gateway.h"
#include "testing/dev_pki.h"
#include "testing/wait.h"
#include "tests/integration/joined_node.h"

namespace bcd {
namespace {

namespace v1 = bettercompute::agent::v1;
using bcd::testing::JoinedNode;
using bcd::testing::RunShell;
using bcd::testing::WaitFor;
using std::chrono::seconds;

constexpr auto kWait = seconds(20);

class Diag : public ::testing::Test {
 protected:
  Diag()
      : node_(
            {.extra_config =
                 [](const std::filesystem::path&) { return "[diag]\nlisten = \"127.0.0.1:0\"\n"; },
             .gateway = {.node_cert_lifetime = 9}}) {
    node_.Start(std::make_unique<NodeMode>(), {.liveness_period = std::chrono::milliseconds(100)});
    EXPECT_TRUE(node_.gateway->WaitForWelcomes(1, kWait));
    port_ = node_.agent->diag_port();
    EXPECT_NE(port_, 0);
  }

  // curl's answer to GET `path`: "<status>\n<body>".
  std::string Get(const std::string& path) {
    return RunShell(fmt::format("curl -sS -m 10 -w '%{{http_code}}\\n' -o /dev/stdout "
                                "http://127.0.0.1:{}{}",
                                port_, path))
        .out;
  }
  int StatusOf(const std::string& path) {
    testing::Ran ran = RunShell(fmt::format(
        "curl -sS -m 10 -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{}{}", port_, path));
    return ran.status == 0 ? std::stoi(ran.out) : -1;
  }

  // The samples of /metrics as parse-prometheus-text-format reads them, by "name{k=v,...}" (labels
  // sorted); the test fails when the text does not parse.
  std::map<std::string, double> Scrape() {
    std::string script = std::string(BCD_SOURCE_DIR) + "/tests/interop/prom-parse.mjs";
    testing::Ran ran = RunShell(
        fmt::format("curl -sS -m 10 http://127.0.0.1:{}/metrics | node {} 2>&1", port_, script));
    EXPECT_EQ(ran.status, 0) << ran.out;
    std::map<std::string, double> values;
    nlohmann::json families = nlohmann::json::parse(ran.out, nullptr, false);
    if (!families.is_array()) {
      ADD_FAILURE() << "not a list of families: " << ran.out;
      return values;
    }
    for (const auto& family : families) {
      for (const auto& metric : family["metrics"]) {
        std::string key = family["name"].get<std::string>();
        if (metric.contains("labels") && !metric["labels"].empty()) {
          std::string labels;
          for (const auto& [k, v] : metric["labels"].items()) {  // nlohmann keeps keys sorted
            labels += (labels.empty() ? "" : ",") + k + "=" + v.get<std::string>();
          }
          key += "{" + labels + "}";
        }
        values[key] = std::stod(metric["value"].get<std::string>());
      }
    }
    return values;
  }
  double Value(const std::string& key) {
    std::map<std::string, double> values = Scrape();
    auto it = values.find(key);
    return it == values.end() ? -1 : it->second;
  }
  // Waits until the sample `key` is at least `at_least`.
  bool Reaches(const std::string& key, double at_least) {
    return WaitFor([&] { return Value(key) >= at_least; }, kWait, std::chrono::milliseconds(100));
  }

  void Send(const v1::SignedCommand& command) {
    v1::ServerFrame frame;
    *frame.mutable_command() = command;
    ASSERT_TRUE(node_.gateway->Push("n-1", frame));
  }

  JoinedNode node_;
  uint16_t port_ = 0;
};

TEST_F(Diag, MetricsPassPromtoolsLint) {
  // promtool checks the exposition the way Prometheus reads it, and lints names, units and
  // help: exit 0 and nothing said.
  testing::Ran ran = RunShell(
      fmt::format("curl -sS -m 10 http://127.0.0.1:{}/metrics | promtool check metrics", port_));
  EXPECT_EQ(ran.status, 0) << ran.out;
  EXPECT_EQ(ran.out, "") << ran.out;
  std::string head =
      RunShell(fmt::format("curl -sS -m 10 -I http://127.0.0.1:{}/metrics", port_)).out;
  EXPECT_NE(head.find("Content-Type: text/plain; version=0.0.4; charset=utf-8"), std::string::npos)
      << head;
}

TEST_F(Diag, SessionAndProcessFiguresAreThereFromTheStart) {
  std::map<std::string, double> values = Scrape();
  EXPECT_EQ(values["bcd_session_up"], 1);
  EXPECT_EQ(values["bcd_session_welcomes_total"], 1);
  EXPECT_GE(values["bcd_frames_received_total{case=welcome}"], 1);
  EXPECT_GE(values["bcd_frames_sent_total{case=hello}"], 1);
  EXPECT_GE(values["bcd_frames_sent_total{case=status}"], 1);
  EXPECT_EQ(values["bcd_build_info{mode=node,version=" + std::string(Version()) + "}"], 1);
  EXPECT_GT(values["process_resident_memory_bytes"], 1 << 20);
  EXPECT_GE(values["process_threads"], 4);
  EXPECT_GE(values["process_open_fds"], 5);
  EXPECT_GT(values["bcd_certificate_seconds_left"], 0);
  EXPECT_LE(values["bcd_certificate_seconds_left"], 9);
  EXPECT_GT(values["bcd_fsyncs_total"], 0) << "the join and the first outbox entries synced";
  EXPECT_EQ(values["bcd_tunnels_open"], 0);
  EXPECT_EQ(values["bcd_outbox_entries"], 0);
}

TEST_F(Diag, CommandsAndRefusalsAreCountedByKindStateAndCode) {
  int64_t now = testing::SystemNow();
  Send(node_.pki.SignCommand(testing::DevPki::MakeCommand("c-1", "n-1", "inventory.refresh", now)));
  EXPECT_TRUE(Reaches("bcd_commands_total{kind=inventory.refresh,state=succeeded}", 1));
  // A command for another node is refused at admission.
  Send(node_.pki.SignCommand(
      testing::DevPki::MakeCommand("c-2", "n-other", "inventory.refresh", now)));
  EXPECT_TRUE(Reaches("bcd_command_refusals_total{code=wrong_node}", 1)) << node_.LogText();
  std::map<std::string, double> values = Scrape();
  EXPECT_GE(values["bcd_frames_received_total{case=command}"], 2);
  EXPECT_GE(values["bcd_frames_sent_total{case=command_update}"], 2);
  EXPECT_GE(values["bcd_frames_sent_total{case=inventory}"], 1);
  EXPECT_EQ(values["bcd_commands_in_hand{state=running}"], 0);
}

TEST_F(Diag, RenewalsMoveTheCertificateFigures) {
  ASSERT_TRUE(node_.agent->WaitForRenewals(1, seconds(30)));
  EXPECT_TRUE(Reaches("bcd_renewals_total{result=ok}", 1));
  EXPECT_GT(Value("bcd_certificate_seconds_left"), 0);
}

TEST_F(Diag, TunnelsAreCountedWithTheirBytes) {
  v1::NodeSpec spec;
  spec.set_node_id("n-1");
  spec.set_generation(1);
  *spec.mutable_access() = node_.gateway->TunnelAccess();
  v1::ServerFrame frame;
  *frame.mutable_desired_state() = node_.pki.SignSpec(spec);
  ASSERT_TRUE(node_.gateway->Push("n-1", frame));
  ASSERT_TRUE(WaitFor([&] { return node_.agent->desired().applied().has_access(); }, kWait));
  testing::DevTunnel tunnel =
      node_.gateway->OpenTunnel("n-1", {.op = "exec", .cmd = {"sh", "-c", "printf 12345"}});
  testing::DevTunnel::Outcome outcome = tunnel.Collect(kWait);
  EXPECT_EQ(outcome.out, "12345");
  EXPECT_TRUE(Reaches("bcd_tunnels_opened_total{op=exec}", 1));
  EXPECT_TRUE(Reaches("bcd_tunnel_bytes_total{direction=out}", 5));
  // A ticket for an op the access section does not allow is refused, and counted.
  node_.gateway->OpenTunnel("n-1", {.op = "exec", .cmd = {"true"}, .jti = "same"});
  node_.gateway->OpenTunnel("n-1", {.op = "exec", .cmd = {"true"}, .jti = "same"});
  EXPECT_TRUE(Reaches("bcd_tunnel_refusals_total", 1));
}

TEST_F(Diag, ReadyzFollowsTheSessionAndRedialsAreCountedByReason) {
  EXPECT_EQ(Get("/readyz"), "ready\n200\n");
  EXPECT_EQ(Get("/healthz"), "ok\n200\n");
  node_.gateway->RefuseSessions(1, 14, "draining", 0);  // UNAVAILABLE, x-bc-reason: draining
  node_.gateway->DropSessions();
  EXPECT_TRUE(Reaches("bcd_session_redials_total{reason=draining}", 1));
  EXPECT_TRUE(node_.gateway->WaitForWelcomes(2, kWait));
  EXPECT_TRUE(Reaches("bcd_session_welcomes_total", 2));
  // The gateway goes away: not ready, saying why, while the process stays healthy.
  node_.gateway.reset();
  ASSERT_TRUE(WaitFor([&] { return StatusOf("/readyz") == 503; }, kWait));
  std::string readyz = Get("/readyz");
  EXPECT_TRUE(readyz.starts_with("no session: ")) << readyz;
  EXPECT_EQ(Value("bcd_session_up"), 0);
  EXPECT_GE(Value("bcd_session_redials_total{reason=dial_failed}") +
                Value("bcd_session_redials_total{reason=unavailable}"),
            1);
  EXPECT_EQ(StatusOf("/healthz"), 200);
}

TEST_F(Diag, AskedAnythingElseItSaysWhat) {
  EXPECT_EQ(Get("/nope"), "no such path: /metrics, /healthz or /readyz\n404\n");
  testing::Ran post = RunShell(fmt::format(
      "curl -sS -m 10 -X POST -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{}/metrics",
      port_));
  EXPECT_EQ(post.out, "405");
  // A client that sends half a request is cut off at the deadline; the next one is served.
  testing::Ran slow = RunShell(fmt::format(
      "timeout 20 bash -c 'exec 3<>/dev/tcp/127.0.0.1/{}; printf \"GET /metrics HTTP/1.1\\r\\n\" "
      ">&3; cat <&3 | wc -c'",
      port_));
  EXPECT_EQ(slow.out, "0\n") << "closed without an answer";
  EXPECT_EQ(StatusOf("/healthz"), 200);
}

}  // namespace
}  // namespace bcd
