// bcd-dev: the dev stack from a shell.
//
//   bcd-dev up [--dir DIR] [--seconds N] [--protocol MIN..MAX] [--bcd PATH]
//
// Starts the dev gateway on loopback with a fresh dev PKI, joins a `bcd node` to it with a one-time
// token, runs the node in the foreground (its log lines on stderr) and prints what the gateway
// sees, until Ctrl-C or N seconds; then stops the node with SIGTERM and prints `bcd status`.

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
#include "testing/child_process.h"
#include "testing/dev_gateway.h"
#include "transport/tls.h"

namespace {

using bcd::testing::DevGateway;
using bcd::testing::DevPki;
using bcd::testing::SpawnChild;
using bcd::testing::WaitChild;

std::string Json(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

int Usage() {
  std::fprintf(stderr,
               "usage: bcd-dev up [--dir DIR] [--seconds N] [--protocol MIN..MAX] [--bcd PATH]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] != "up") return Usage();
  std::string dir, protocol = "1..1", bcd = BCD_DEFAULT_BINARY;
  int seconds = 0;
  for (std::size_t i = 1; i < args.size(); ++i) {
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
  std::ofstream(config) << "gateway_url = \"https://127.0.0.1:" << (*gateway)->port() << "\"\n"
                        << "gateway_server_name = \"" << DevPki::kGatewayName << "\"\n"
                        << "gateway_ca_spki_sha256 = \"" << pki->ServingCaPinHex() << "\"\n"
                        << "state_dir = \"" << dir << "/state\"\n";
  std::printf("dev gateway: %s (protocol %s), serving CA pin %s\n", (*gateway)->target().c_str(),
              protocol.c_str(), pki->ServingCaPinHex().c_str());
  std::printf("config: %s\n\n$ bcd join --token ... --config %s\n", config.c_str(), config.c_str());
  std::fflush(stdout);
  int joined = WaitChild(SpawnChild(
      {bcd, "join", "--config", config, "--token", (*gateway)->AddJoinToken("dev-node-1")}));
  if (joined != 0) return std::fprintf(stderr, "bcd-dev: bcd join exited %d\n", joined), 1;

  std::printf("\n$ bcd node --config %s\n", config.c_str());
  std::fflush(stdout);
  pid_t node = SpawnChild({bcd, "node", "--config", config});
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
      std::printf("gateway: Hello from dev-node-1 %s\n",
                  Json(*(*gateway)->LastHello("dev-node-1")).c_str());
    }
    auto frames = (*gateway)->Received("dev-node-1");
    for (; shown < frames.size(); ++shown)
      std::printf("gateway: received %s\n", Json(frames[shown]).c_str());
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
