// The dev stack from a shell, as the README shows it: `bcd-dev up` in the background, then
// `bcd-dev run` and `bcd-dev spec` against it. Real processes, real sockets.

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "testing/bmc_emulators.h"
#include "testing/child_process.h"
#include "testing/dev_control.h"
#include "testing/dev_gateway.h"
#include "testing/wait.h"
#include "tests/unit/fake_root.h"

namespace bcd {
namespace {

using bcd::testing::FakeRoot;

using bcd::testing::Ran;
Ran RunTool(const std::string& command) { return bcd::testing::RunShell(command); }

// Waits for `up` to serve DIR/dev.sock and for a first inventory.refresh through it to succeed.
Ran FirstRun(const std::string& tool, const std::string& stack) {
  Ran ready{1, ""};
  bcd::testing::WaitFor(
      [&] {
        if (std::filesystem::exists(stack + "/dev.sock"))
          ready = RunTool(tool + " run inventory.refresh --dir " + stack);
        return ready.status == 0;
      },
      std::chrono::seconds(20), std::chrono::milliseconds(100));
  return ready;
}

TEST(DevStack, RunAndSpecAgainstARunningUp) {
  FakeRoot dir;
  std::string stack = (dir.path() / "stack").string();
  setenv("XDG_RUNTIME_DIR", dir.path().c_str(), 1);  // where up says it runs: not the user's
  pid_t up = bcd::testing::SpawnChild(
      {BCD_DEV_BINARY, "up", "--dir", stack, "--seconds", "120", "--bcd", BCD_BINARY});
  ASSERT_GT(up, 0);
  std::string tool = std::string(BCD_DEV_BINARY);
  Ran ready = FirstRun(tool, stack);
  EXPECT_EQ(ready.status, 0) << ready.out;
  EXPECT_NE(ready.out.find("\"state\": \"COMMAND_STATE_SUCCEEDED\""), std::string::npos);
  EXPECT_NE(ready.out.find("\"collected_at\""), std::string::npos);

  // node.reboot needs 2 of 3 approvals in the dev stack: bcd-dev approves as the control plane.
  Ran reboot = RunTool(tool + " run node.reboot '{\"reason\": \"test\"}' --dir " + stack);
  EXPECT_EQ(reboot.status, 0) << reboot.out;
  EXPECT_NE(reboot.out.find("\"scheduled_at\""), std::string::npos) << reboot.out;

  Ran spec = RunTool(tool + " spec '{\"daemon\": {\"log_level\": \"warn\"}}' --dir " + stack);
  EXPECT_EQ(spec.status, 0) << spec.out;
  EXPECT_NE(spec.out.find("SPEC_ACK_STATE_APPLIED"), std::string::npos) << spec.out;

  Ran failed =
      RunTool(tool + " run logs.collect '{\"upload_url\": \"http://192.0.2.1/x\"}' --dir " + stack);
  EXPECT_EQ(failed.status, 1);
  EXPECT_NE(failed.out.find("plain http is allowed only to loopback addresses, and 192.0.2.1 "
                            "resolves to 192.0.2.1"),
            std::string::npos)
      << failed.out;
  Ran unknown = RunTool(tool + " run disk.format --dir " + stack);
  EXPECT_EQ(unknown.status, 1);
  EXPECT_EQ(unknown.out, "bcd-dev: unknown kind \"disk.format\"\n");

  Ran secret = RunTool(tool + " secret secret://db/pw dev-value --step wf-1/step-1 --dir " + stack);
  EXPECT_EQ(secret.status, 0) << secret.out;
  EXPECT_NE(secret.out.find("\"bound\": true"), std::string::npos) << secret.out;
  EXPECT_EQ(RunTool(tool + " secret secret://db/pw dev-value --dir " + stack).status, 2)
      << "a secret needs a binding";

  // The operator's side of tunnels: exec and a shell through the gateway.
  Ran exec = RunTool("echo from-stdin | " + tool + " exec --dir " + stack +
                     " -- sh -c 'cat; echo out; echo err >&2; exit 3'");
  EXPECT_EQ(exec.status, 3) << exec.out;
  EXPECT_NE(exec.out.find("from-stdin\nout\n"), std::string::npos) << exec.out;
  EXPECT_NE(exec.out.find("err\n"), std::string::npos) << exec.out;
  Ran shell = RunTool("printf 'echo in-the-shell; exit 4\\n' | " + tool + " shell --dir " + stack);
  EXPECT_EQ(shell.status, 4) << shell.out;
  EXPECT_NE(shell.out.find("in-the-shell"), std::string::npos) << shell.out;

  // The installer for a second machine of this stack: a token from the running gateway, the
  // stack's gateway and pin, this build's bcd; run with --root it joins as that node.
  std::string script = (dir.path() / "install.sh").string();
  Ran generated =
      RunTool(tool + " install-script --node installed-2 --dir " + stack + " > " + script);
  EXPECT_EQ(generated.status, 0) << generated.out;
  Ran installed = RunTool("sh " + script + " --root " + (dir.path() / "node-2").string());
  EXPECT_EQ(installed.status, 0) << installed.out;
  EXPECT_NE(installed.out.find("joined as spiffe://dev.test/site/dev/node/installed-2"),
            std::string::npos)
      << installed.out;
  Ran bad_id = RunTool(tool + " install-script --node Bad_Id --dir " + stack);
  EXPECT_EQ(bad_id.status, 1);
  EXPECT_EQ(bad_id.out, "bcd-dev: a node id is 1 to 63 of a-z, 0-9 and -\n");

  // Without --dir, run finds the stack up recorded.
  Ran found = RunTool(tool + " run inventory.refresh");
  EXPECT_EQ(found.status, 0) << found.out;

  kill(up, SIGTERM);
  EXPECT_EQ(bcd::testing::WaitChild(up), 0);
  Ran gone = RunTool(tool + " run inventory.refresh --dir " + stack);
  EXPECT_EQ(gone.status, 1);
  EXPECT_NE(gone.out.find("is bcd-dev up running?"), std::string::npos) << gone.out;
}

// The same stack with the node on the WebSocket transport: the real binaries, signed intent only.
TEST(DevStack, UpWithWebSocketRunsCommandsOverIt) {
  FakeRoot dir;
  std::string stack = (dir.path() / "stack").string();
  setenv("XDG_RUNTIME_DIR", dir.path().c_str(), 1);
  unsetenv("https_proxy");
  unsetenv("HTTPS_PROXY");
  std::string out = (dir.path() / "up.out").string();
  pid_t up = bcd::testing::SpawnChild(
      {"sh", "-c",
       "exec " + std::string(BCD_DEV_BINARY) + " up --websocket --dir " + stack +
           " --seconds 120 --bcd " + BCD_BINARY + " > " + out + " 2>&1"});
  ASSERT_GT(up, 0);
  std::string tool = std::string(BCD_DEV_BINARY);
  Ran ready = FirstRun(tool, stack);
  EXPECT_EQ(ready.status, 0) << ready.out;
  Ran reboot = RunTool(tool + " run node.reboot '{\"reason\": \"test\"}' --dir " + stack);
  EXPECT_EQ(reboot.status, 0) << reboot.out;
  // up prints what the gateway saw on its next tick (every 200 ms).
  Ran printed{0, ""};
  bcd::testing::WaitFor(
      [&] {
        printed = RunTool("cat " + out);
        return printed.out.find("gateway: Hello from dev-node-1 over websocket") !=
               std::string::npos;
      },
      std::chrono::seconds(10), std::chrono::milliseconds(100));
  EXPECT_NE(printed.out.find("gateway: Hello from dev-node-1 over websocket"), std::string::npos)
      << printed.out;
  kill(up, SIGTERM);
  EXPECT_EQ(bcd::testing::WaitChild(up), 0);
  EXPECT_NE(printed.out.find("[websocket]"), std::string::npos) << printed.out;
}

// bcd-dev up --site: a site agent and two BMCs, Redfish where it is served, IPMI on the other.
TEST(DevStack, UpSiteDrivesARedfishAndAnIpmiBmcAndServesBootEntries) {
  FakeRoot dir;
  std::string stack = (dir.path() / "stack").string();
  setenv("XDG_RUNTIME_DIR", dir.path().c_str(), 1);
  std::string out = (dir.path() / "up.out").string();
  pid_t up = bcd::testing::SpawnChild({"sh", "-c",
                                       "exec " + std::string(BCD_DEV_BINARY) + " up --site --dir " +
                                           stack + " --seconds 120 --bcd " + BCD_BINARY + " > " +
                                           out + " 2>&1"});
  ASSERT_GT(up, 0);
  std::string tool = std::string(BCD_DEV_BINARY);
  Ran ready = FirstRun(tool, stack);
  EXPECT_EQ(ready.status, 0) << ready.out;
  Ran redfish = RunTool(tool +
                        " run bmc.powerStatus '{\"bmc\": {\"address\": \"127.0.0.1\", "
                        "\"credential_ref\": \"bmc/dev\"}}' --dir " +
                        stack);
  EXPECT_EQ(redfish.status, 0) << redfish.out;
  EXPECT_NE(redfish.out.find("\"protocol\": \"BMC_PROTOCOL_REDFISH\""), std::string::npos)
      << redfish.out;
  if (bcd::testing::HaveIpmiSim()) {
    Ran ipmi = RunTool(tool +
                       " run bmc.powerOn '{\"bmc\": {\"address\": \"127.0.0.2\", "
                       "\"credential_ref\": \"bmc/dev\"}}' --dir " +
                       stack);
    EXPECT_EQ(ipmi.status, 0) << ipmi.out;
    EXPECT_NE(ipmi.out.find("\"power_state\": \"on\""), std::string::npos) << ipmi.out;
    EXPECT_NE(ipmi.out.find("\"protocol\": \"BMC_PROTOCOL_IPMI\""), std::string::npos) << ipmi.out;
  }
  // The boot.prepareRamdisk up printed works as printed, and the boot server then has the
  // machine's script (the images cached from the release server against their pins).
  std::string shown = RunTool("cat " + out).out;
  std::smatch prepare, boot;
  ASSERT_TRUE(
      std::regex_search(shown, prepare, std::regex("bcd-dev run boot.prepareRamdisk '([^']*)'")))
      << shown;
  ASSERT_TRUE(std::regex_search(shown, boot, std::regex("boot server: http://127.0.0.1:([0-9]+)")))
      << shown;
  Ran prepared =
      RunTool(tool + " run boot.prepareRamdisk '" + prepare[1].str() + "' --dir " + stack);
  EXPECT_EQ(prepared.status, 0) << prepared.out;
  EXPECT_NE(prepared.out.find("\"boot_entry_id\": \"dev-1\""), std::string::npos) << prepared.out;
  Ran script =
      RunTool("curl -sS http://127.0.0.1:" + boot[1].str() + "/boot/52-54-00-12-34-56.ipxe");
  EXPECT_NE(script.out.find("kernel http://10.0.2.2:" + boot[1].str() +
                            "/boot/52-54-00-12-34-56/kernel console=ttyS0 panic=-1"),
            std::string::npos)
      << script.out;
  kill(up, SIGTERM);
  EXPECT_EQ(bcd::testing::WaitChild(up), 0);
  std::string printed = RunTool("cat " + out).out;
  EXPECT_NE(printed.find("gateway: Hello from dev-site-1"), std::string::npos) << printed;
  EXPECT_NE(printed.find("\"role\":\"ROLE_SITE\""), std::string::npos) << printed;
  // The emulator and ipmi_sim went with the stack.
  // (bm[c]: the pattern does not match the shell that runs pgrep)
  EXPECT_EQ(RunTool("pgrep -f '" + stack + "/bm[c]/'").out, "");
}

// The fds of process `pid`, by number.
std::set<int> FdsOf(pid_t pid) {
  std::set<int> fds;
  std::error_code ec;
  for (const auto& entry :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    fds.insert(std::stoi(entry.path().filename().string()));
  }
  return fds;
}

TEST(DevStack, AChildOfTheStackInheritsNoneOfItsSockets) {
  testing::DevPki pki = *testing::DevPki::Create(std::time(nullptr));
  std::unique_ptr<testing::DevGateway> gateway = *testing::DevGateway::Start(pki, {});
  pid_t child = bcd::testing::SpawnChild({"sleep", "30"});
  ASSERT_GT(child, 0);
  // While sleep starts, its loader and setlocale hold a file open for a moment: wait for the set
  // to settle. An inherited socket never goes away, so the check still fails when one leaks.
  std::set<int> fds;
  bcd::testing::WaitFor(
      [&] {
        return (fds = FdsOf(child)) == std::set<int>{0, 1, 2};
      },
      std::chrono::seconds(5));
  kill(child, SIGKILL);
  bcd::testing::WaitChild(child);
  EXPECT_EQ(fds, (std::set<int>{0, 1, 2}));
}

TEST(DevStack, AMalformedRequestIsRefusedAndTheStackKeepsServing) {
  FakeRoot dir;
  testing::DevPki pki = *testing::DevPki::Create(std::time(nullptr));
  std::unique_ptr<testing::DevGateway> gateway = *testing::DevGateway::Start(pki, {});
  testing::DevControlPlane control(&pki, gateway.get());
  std::filesystem::path socket = dir.path() / "dev.sock";
  ASSERT_TRUE(control.Serve(socket, "dev-node-1").ok());
  for (const char* request :
       {R"({"op": 5})", R"({"op": "secret", "ref": "r", "value": "v", "workflow_id": 7})",
        R"({"op": "token", "node": ["x"]})", R"([1, 2])", "not json", ""}) {
    absl::StatusOr<std::string> answer = testing::AskDevControl(socket, request);
    ASSERT_TRUE(answer.ok()) << request << ": " << answer.status();
    nlohmann::json reply = nlohmann::json::parse(*answer, nullptr, false);
    EXPECT_EQ(reply.value("ok", true), false) << request << ": " << *answer;
  }
  absl::StatusOr<std::string> token =
      testing::AskDevControl(socket, R"({"op": "token", "node": "n-2"})");
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(nlohmann::json::parse(*token).value("ok", false), true) << *token;
}

TEST(DevStack, UpKeepsTheTokenOffCommandLinesAndItsRecordOutOfTmp) {
  FakeRoot dir;
  std::string stack = (dir.path() / "stack").string();
  // A bcd that records how it was called, then runs the real one.
  std::string calls = (dir.path() / "calls").string();
  dir.Write("bcd", "#!/bin/sh\necho \"$*\" >> " + calls + "\nexec " BCD_BINARY " \"$@\"\n");
  chmod((dir.path() / "bcd").c_str(), 0755);
  std::string before = RunTool("cat /tmp/bcd-dev.current 2>/dev/null").out;
  std::string home = (dir.path() / "home").string();
  pid_t up = bcd::testing::SpawnChild({"env", "-u", "XDG_RUNTIME_DIR", "-u", "XDG_STATE_HOME",
                                       "HOME=" + home, BCD_DEV_BINARY, "up", "--dir", stack,
                                       "--seconds", "120", "--bcd", (dir.path() / "bcd").string()});
  ASSERT_GT(up, 0);
  Ran ready = FirstRun(BCD_DEV_BINARY, stack);
  EXPECT_EQ(ready.status, 0) << ready.out;
  std::string recorded = RunTool("cat " + home + "/.local/state/bcd-dev/current").out;
  kill(up, SIGTERM);
  EXPECT_EQ(bcd::testing::WaitChild(up), 0);
  EXPECT_EQ(recorded, stack + "\n");
  EXPECT_EQ(RunTool("cat /tmp/bcd-dev.current 2>/dev/null").out, before) << "written to /tmp";
  std::string joins = RunTool("grep '^join' " + calls).out;
  EXPECT_NE(joins.find("--token-file"), std::string::npos) << joins;
  EXPECT_EQ(joins.find("--token "), std::string::npos) << "the token was on a command line";
  EXPECT_FALSE(std::filesystem::exists(stack + "/join-token")) << "the token file stays";
}

}  // namespace
}  // namespace bcd
