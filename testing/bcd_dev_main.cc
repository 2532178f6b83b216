// bcd-dev: the dev stack from a shell.
//
//   bcd-dev up [--dir DIR] [--seconds N] [--protocol MIN..MAX] [--bcd PATH] [--websocket]
//   bcd-dev run KIND [JSON] [--dir DIR]
//   bcd-dev spec JSON [--dir DIR]
//   bcd-dev secret REF VALUE (--step WORKFLOW/STEP | --allocation ID | --host SECTION/FIELD)
//                 [--dir DIR]
//
// `up` starts the dev gateway on loopback with a fresh dev PKI, joins a `bcd node` to it with a
// one-time token, hands it the dev approver set, runs the node in the foreground (its log lines on
// stderr) and prints what the gateway sees, until Ctrl-C or N seconds; then stops the node with
// SIGTERM and prints `bcd status`. While it runs, `run` signs a command of KIND with the JSON
// payload (approved by the dev approvers when the kind needs a quorum), sends it to the node and
// prints its updates and result; `spec` signs and sends desired state and prints the SpecAck.
// `secret` puts a secret in the dev broker, bound as given. All three find the running stack
// through DIR/dev.sock; DIR defaults to the last `up`'s. With --websocket the node joins over gRPC
// and then runs over the gateway's WebSocket listener (signed intent only, renewals over HTTPS).

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"
#include "testing/child_process.h"
#include "testing/dev_control.h"
#include "testing/dev_gateway.h"
#include "transport/tls.h"

namespace {

using bcd::testing::DevGateway;
using bcd::testing::DevPki;
using bcd::testing::SpawnChild;
using bcd::testing::WaitChild;

int Usage() {
  std::fprintf(stderr,
               "usage: bcd-dev up [--dir DIR] [--seconds N] [--protocol MIN..MAX] [--bcd PATH] "
               "[--websocket]\n"
               "       bcd-dev run KIND [JSON] [--dir DIR]\n"
               "       bcd-dev spec JSON [--dir DIR]\n"
               "       bcd-dev secret REF VALUE (--step WORKFLOW/STEP | --allocation ID |\n"
               "                                 --host SECTION/FIELD) [--dir DIR]\n");
  return 2;
}

// Where `up` records its directory for `run` and `spec`.
std::filesystem::path CurrentFile() {
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  return std::filesystem::path(runtime != nullptr && *runtime != '\0' ? runtime : "/tmp") /
         "bcd-dev.current";
}

// bcd-dev run / spec: one request to the running stack; exit 0 when the command succeeded or the
// spec was applied.
int Ask(const std::vector<std::string>& args) {
  std::vector<std::string> positional;
  std::string dir;
  nlohmann::json binding = nlohmann::json::object();
  for (std::size_t i = 1; i < args.size(); ++i) {
    bool takes_value = args[i] == "--dir" || args[i] == "--step" || args[i] == "--allocation" ||
                       args[i] == "--host";
    if (takes_value && i + 1 >= args.size()) return Usage();
    if (args[i] == "--dir") {
      dir = args[++i];
    } else if (args[i] == "--step" || args[i] == "--host") {
      std::string value = args[++i];
      std::size_t slash = value.find('/');
      if (slash == std::string::npos) return Usage();
      binding["workflow_id"] = (args[i - 1] == "--host" ? "host:" : "") + value.substr(0, slash);
      binding["step_id"] = value.substr(slash + 1);
    } else if (args[i] == "--allocation") {
      binding["allocation_id"] = args[++i];
    } else {
      positional.push_back(args[i]);
    }
  }
  nlohmann::json request;
  if (args[0] == "run" && (positional.size() == 1 || positional.size() == 2)) {
    request = {{"op", "run"}, {"kind", positional[0]}};
    if (positional.size() == 2) {
      request["payload"] = nlohmann::json::parse(positional[1], nullptr, false);
      if (request["payload"].is_discarded())
        return std::fprintf(stderr, "bcd-dev: the payload is not JSON\n"), 2;
    }
  } else if (args[0] == "secret" && positional.size() == 2 && !binding.empty()) {
    request = binding;
    request["op"] = "secret";
    request["ref"] = positional[0];
    request["value"] = positional[1];
  } else if (args[0] == "spec" && positional.size() == 1) {
    request = {{"op", "spec"}, {"spec", nlohmann::json::parse(positional[0], nullptr, false)}};
    if (request["spec"].is_discarded())
      return std::fprintf(stderr, "bcd-dev: the spec is not JSON\n"), 2;
  } else {
    return Usage();
  }
  if (dir.empty()) {
    std::ifstream current(CurrentFile());
    std::getline(current, dir);
    if (dir.empty()) {
      return std::fprintf(stderr, "bcd-dev: no running stack found (%s); pass --dir DIR\n",
                          CurrentFile().c_str()),
             1;
    }
  }
  absl::StatusOr<std::string> answer =
      bcd::testing::AskDevControl(std::filesystem::path(dir) / "dev.sock", request.dump());
  if (!answer.ok())
    return std::fprintf(stderr, "bcd-dev: %s\n", std::string(answer.status().message()).c_str()), 1;
  nlohmann::json reply = nlohmann::json::parse(*answer, nullptr, false);
  if (!reply.is_object() || !reply.value("ok", false)) {
    std::string error = reply.is_object() ? reply.value("error", *answer) : *answer;
    return std::fprintf(stderr, "bcd-dev: %s\n", error.c_str()), 1;
  }
  std::printf("%s\n", reply["answer"].dump(2).c_str());
  const nlohmann::json& outcome = reply["answer"];
  bool good = outcome.value("state", "") == "COMMAND_STATE_SUCCEEDED" ||
              outcome.value("state", "") == "SPEC_ACK_STATE_APPLIED" ||
              outcome.value("bound", false);
  return good ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && (args[0] == "run" || args[0] == "spec" || args[0] == "secret"))
    return Ask(args);
  if (args.empty() || args[0] != "up") return Usage();
  std::string dir, protocol = "1..1", bcd = BCD_DEFAULT_BINARY;
  int seconds = 0;
  bool websocket = false;
  for (std::size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--websocket") {
      websocket = true;
      continue;
    }
    if (i + 1 >= args.size()) return Usage();
    if (args[i] == "--dir")
      dir = args[++i];
    else if (args[i] == "--seconds")
      seconds = std::atoi(args[++i].c_str());
    else if (args[i] == "--protocol")
      protocol = args[++i];
    else if (args[i] == "--bcd")
      bcd = args[++i];
    else
      return Usage();
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (dir.empty()) {
    std::string pattern = "/tmp/bcd-dev-XXXXXX";
    dir = mkdtemp(pattern.data());
  }
  std::filesystem::create_directories(dir);
  absl::StatusOr<DevPki> pki = DevPki::Create(std::time(nullptr));
  if (!pki.ok())
    return std::fprintf(stderr, "bcd-dev: %s\n", std::string(pki.status().message()).c_str()), 1;
  absl::StatusOr<std::unique_ptr<DevGateway>> gateway =
      DevGateway::Start(*pki, {.protocol = protocol});
  if (!gateway.ok())
    return std::fprintf(stderr, "bcd-dev: %s\n", std::string(gateway.status().message()).c_str()),
           1;
  std::string config = dir + "/config.toml";
  std::ofstream(config) << (*gateway)->ConfigToml(dir + "/state") << "[node]\n"
                        << "reboot_command = [\"/bin/true\"]  # the dev stack never reboots\n";
  std::printf(
      "dev gateway: %s (protocol %s), WebSocket wss://127.0.0.1:%d/v1/session, serving "
      "CA pin %s\n",
      (*gateway)->target().c_str(), protocol.c_str(), (*gateway)->websocket_port(),
      pki->ServingCaPinHex().c_str());
  std::printf("config: %s\n\n$ bcd join --token ... --config %s\n", config.c_str(), config.c_str());
  std::fflush(stdout);
  int joined = WaitChild(SpawnChild(
      {bcd, "join", "--config", config, "--token", (*gateway)->AddJoinToken("dev-node-1")}));
  if (joined != 0) return std::fprintf(stderr, "bcd-dev: bcd join exited %d\n", joined), 1;
  if (websocket) {
    std::ofstream(config, std::ios::app) << (*gateway)->WebSocketConfigToml();
    std::printf("\nconfig: added [websocket]: the node runs over the WebSocket transport\n");
  }

  std::printf("\n$ bcd node --config %s\n", config.c_str());
  std::fflush(stdout);
  pid_t node = SpawnChild({bcd, "node", "--config", config});
  bcd::testing::DevControlPlane control(&*pki, gateway->get());
  if (absl::Status s = control.Serve(std::filesystem::path(dir) / "dev.sock", "dev-node-1");
      !s.ok()) {
    std::fprintf(stderr, "bcd-dev: %s\n", std::string(s.message()).c_str());
  }
  std::ofstream(CurrentFile()) << dir << "\n";
  bool trusted = false;
  std::size_t shown = 0;
  bool welcomed = false;
  timespec tick{0, 200 * 1000 * 1000};
  auto deadline = std::time(nullptr) + seconds;
  while (seconds == 0 || std::time(nullptr) < deadline) {
    if (sigtimedwait(&signals, nullptr, &tick) > 0) break;
    if (waitpid(node, nullptr, WNOHANG) == node) {
      std::printf("bcd node exited\n");
      node = -1;
      break;
    }
    if (!welcomed && (*gateway)->LastHello("dev-node-1")) {
      welcomed = true;
      std::printf("gateway: Hello from dev-node-1 over %s %s\n",
                  (*gateway)->LastTransport("dev-node-1").c_str(),
                  bcd::testing::ProtoJson(*(*gateway)->LastHello("dev-node-1")).c_str());
    }
    if (welcomed && !trusted) {
      // The control plane's approver set: destructive kinds need 2 of 3 approvals from now on.
      bettercompute::agent::v1::ServerFrame frame;
      *frame.mutable_trust() = control.ApproverBundle();
      trusted = (*gateway)->Push("dev-node-1", frame);
      if (trusted) {
        std::printf("gateway: sent trust bundle 2 with the dev approver set (2 of 3)\n");
        std::printf("\nready: bcd-dev run inventory.refresh   (in another shell)\n\n");
      }
    }
    auto frames = (*gateway)->Received("dev-node-1");
    for (; shown < frames.size(); ++shown)
      std::printf("gateway: received %s\n", bcd::testing::ProtoJson(frames[shown]).c_str());
    std::fflush(stdout);
  }
  if (node > 0) {
    kill(node, SIGTERM);
    std::printf("\nbcd node stopped with SIGTERM, exit %d\n", WaitChild(node));
  }
  std::printf("\n$ bcd status --config %s\n", config.c_str());
  std::fflush(stdout);
  WaitChild(SpawnChild({bcd, "status", "--config", config}));
  std::printf("\nthe dev stack's files stay in %s\n", dir.c_str());
  return 0;
}
