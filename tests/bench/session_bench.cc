// Prints the session figures of quality.md, measured against the dev gateway on loopback with the
// real bcd binary: median `bcd join`, median process start to Welcome over gRPC, over WebSocket
// and over WebSocket through Debian's tinyproxy (interleaved, run by run), and the RSS and CPU of
// an idle `bcd node` with a live session.
//
//   build/tests/bench/session_bench [runs=9] [idle_seconds=60] [other_bcd]
//
// With other_bcd (the static build, say: build-static/app/bcd), its process start to Welcome
// over gRPC is measured too, interleaved with this build's, and its idle RSS beside it.

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "config/config.h"
#include "daemon/identity/gateway.h"
#include "daemon/identity/identity.h"
#include "testing/child_process.h"
#include "testing/dev_gateway.h"
#include "transport/grpc_transport.h"
#include "transport/websocket.h"

namespace {

using bcd::testing::DevGateway;
using bcd::testing::DevPki;
using bcd::testing::SpawnChild;
using bcd::testing::WaitChild;
using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string Config(const std::string& dir, const DevGateway& gateway, const DevPki& pki,
                   const std::string& state) {
  std::string path = dir + "/" + state + ".toml";
  std::ofstream(path) << gateway.ConfigToml(dir + "/" + state) << "log_level = \"warn\"\n";
  return path;
}

// (VmRSS in KiB, utime + stime in clock ticks) of a process.
std::pair<long, long> Usage(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  long rss = 0;
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) rss = std::stol(line.substr(6));
  }
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::vector<std::string> f;
  for (std::string x; fields >> x;) f.push_back(x);
  return {rss, std::stol(f[11]) + std::stol(f[12])};  // fields 14 and 15 of /proc/pid/stat
}

// In process: open a session stream, send Hello, read Welcome, end the stream. Milliseconds.
double DialToWelcome(bcd::transport::Transport& transport) {
  auto start = Clock::now();
  auto stream = transport.OpenSession();
  if (!stream.ok()) return -1;
  bettercompute::agent::v1::AgentFrame hello;
  hello.mutable_hello()->set_proto_min(1);
  hello.mutable_hello()->set_proto_max(1);
  hello.mutable_hello()->set_role(bettercompute::common::v1::ROLE_NODE);
  bettercompute::agent::v1::ServerFrame welcome;
  if (!(*stream)->Write(hello) || !(*stream)->Read(&welcome) || !welcome.has_welcome()) return -1;
  double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  (*stream)->CloseSend();
  while ((*stream)->Read(&welcome)) {
  }
  (*stream)->Finish();
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  int runs = argc > 1 ? std::atoi(argv[1]) : 9;
  int idle = argc > 2 ? std::atoi(argv[2]) : 60;
  std::string bcd = BCD_BINARY;
  std::string other = argc > 3 ? argv[3] : "";
  std::string pattern = "/tmp/bcd-bench-XXXXXX";
  std::string dir = mkdtemp(pattern.data());
  DevPki pki = *DevPki::Create(std::time(nullptr));
  auto gateway = *DevGateway::Start(pki, {});

  std::vector<double> joins, starts;
  std::string node_config;
  for (int i = 0; i < runs; ++i) {
    std::string config = Config(dir, *gateway, pki, "state" + std::to_string(i));
    std::string token = gateway->AddJoinToken("bench-" + std::to_string(i));
    auto start = Clock::now();
    if (WaitChild(SpawnChild({bcd, "join", "--config", config, "--token", token})) != 0) return 1;
    joins.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    node_config = config;
  }
  // The same identity over the WebSocket: the config with a [websocket] section.
  std::string ws_config = node_config + ".ws.toml";
  {
    std::ifstream in(node_config);
    std::ofstream out(ws_config);
    out << in.rdbuf() << gateway->WebSocketConfigToml();
  }
  int proxy_port = bcd::testing::FreeLoopbackPort();
  std::ofstream(dir + "/tinyproxy.conf")
      << "Port " << proxy_port << "\nListen 127.0.0.1\nAllow 127.0.0.1\nConnectPort "
      << gateway->websocket_port() << "\nLogLevel Error\n"
      << (geteuid() == 0 ? "User nobody\nGroup nogroup\n" : "");
  pid_t proxy = SpawnChild({"tinyproxy", "-d", "-c", dir + "/tinyproxy.conf"});
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  std::vector<double> ws_starts, proxied_starts;
  int welcomes = 0;
  std::vector<double> other_starts;
  auto start_to_welcome = [&](const std::string& config, std::vector<double>* into,
                              const std::string& binary = "") {
    auto start = Clock::now();
    pid_t pid = SpawnChild({binary.empty() ? bcd : binary, "node", "--config", config});
    if (!gateway->WaitForWelcomes(++welcomes, std::chrono::seconds(30))) return false;
    into->push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    kill(pid, SIGTERM);
    WaitChild(pid);
    return true;
  };
  std::string proxy_url = "http://127.0.0.1:" + std::to_string(proxy_port);
  for (int i = 0; i < runs; ++i) {
    if (!start_to_welcome(node_config, &starts)) return 1;
    if (!start_to_welcome(ws_config, &ws_starts)) return 1;
    if (!other.empty() && !start_to_welcome(node_config, &other_starts, other)) return 1;
    setenv("https_proxy", proxy_url.c_str(), 1);  // the child inherits it
    bool proxied = start_to_welcome(ws_config, &proxied_starts);
    unsetenv("https_proxy");
    if (!proxied) {
      std::fprintf(stderr, "no Welcome through tinyproxy (is it installed?)\n");
      return 1;
    }
  }
  // Dial to Welcome in process, the three ways in turn, with the last node's identity.
  bcd::Config grpc_config = *bcd::Config::Load(node_config);
  bcd::Config ws_config_parsed = *bcd::Config::Load(ws_config);
  bcd::StateDir state = *bcd::StateDir::Open(grpc_config.state_dir());
  bcd::Identity identity = *state.LoadIdentity();
  std::string chain_pem;
  for (const auto& cert : identity.chain) chain_pem += cert.Pem();
  auto clock = [] { return static_cast<int64_t>(std::time(nullptr)); };
  bcd::transport::GrpcTransport grpc(bcd::GatewayChannel(grpc_config, clock), [&] {
    return absl::StatusOr<bcd::transport::ClientIdentity>(
        bcd::transport::ClientIdentity{identity.key.ToPem(), chain_pem});
  });
  auto ws_identity = [&] {
    return absl::StatusOr<bcd::transport::WsNodeIdentity>(
        bcd::transport::WsNodeIdentity{identity.key, identity.chain, identity.node.id.node()});
  };
  bcd::transport::WebSocketSpec direct_spec = *bcd::WebSocketChannel(ws_config_parsed, clock);
  direct_spec.env = [](const char*) { return std::optional<std::string>(); };
  bcd::transport::WebSocketSpec proxied_spec = direct_spec;
  proxied_spec.env = [&](const char* name) {
    return std::string(name) == "https_proxy" ? std::optional<std::string>(proxy_url)
                                              : std::optional<std::string>();
  };
  bcd::transport::WebSocketTransport direct(direct_spec, ws_identity);
  bcd::transport::WebSocketTransport proxied(proxied_spec, ws_identity);
  std::vector<double> grpc_dials, ws_dials, proxied_dials;
  for (int i = 0; i < runs; ++i) {
    grpc_dials.push_back(DialToWelcome(grpc));
    ws_dials.push_back(DialToWelcome(direct));
    proxied_dials.push_back(DialToWelcome(proxied));
    welcomes += 3;
  }
  kill(proxy, SIGTERM);
  WaitChild(proxy);
  pid_t pid = SpawnChild({bcd, "node", "--config", node_config});
  gateway->WaitForWelcomes(++welcomes, std::chrono::seconds(30));
  auto [rss_start, ticks_start] = Usage(pid);
  std::this_thread::sleep_for(std::chrono::seconds(idle));
  auto [rss, ticks] = Usage(pid);
  kill(pid, SIGTERM);
  WaitChild(pid);
  double cpu = 100.0 * static_cast<double>(ticks - ticks_start) / sysconf(_SC_CLK_TCK) / idle;
  std::printf("runs %d, dev gateway on loopback, bcd %s\n", runs, bcd.c_str());
  std::printf("bcd join (key, CSR, Join, persist), median   %7.1f ms\n", Median(joins));
  std::printf(
      "process start to Welcome, median: gRPC %.1f ms, WebSocket %.1f ms (x%.2f), "
      "WebSocket through tinyproxy %.1f ms (x%.2f)\n",
      Median(starts), Median(ws_starts), Median(ws_starts) / Median(starts), Median(proxied_starts),
      Median(proxied_starts) / Median(starts));
  std::printf(
      "dial to Welcome in process, median: gRPC %.2f ms, WebSocket %.2f ms (x%.2f), "
      "WebSocket through tinyproxy %.2f ms (x%.2f)\n",
      Median(grpc_dials), Median(ws_dials), Median(ws_dials) / Median(grpc_dials),
      Median(proxied_dials), Median(proxied_dials) / Median(grpc_dials));
  std::printf("RSS of bcd node with a session: at Welcome %ld KiB, after %d s idle %ld KiB\n",
              rss_start, idle, rss);
  std::printf("CPU while idle for %d s                       %7.3f %% of one core\n", idle, cpu);
  if (!other.empty()) {
    pid_t other_pid = SpawnChild({other, "node", "--config", node_config});
    gateway->WaitForWelcomes(++welcomes, std::chrono::seconds(30));
    std::this_thread::sleep_for(std::chrono::seconds(idle));
    auto [other_rss, other_ticks] = Usage(other_pid);
    kill(other_pid, SIGTERM);
    WaitChild(other_pid);
    std::printf(
        "%s: process start to Welcome over gRPC, median %.1f ms (x%.2f of this build's, same "
        "runs); RSS after %d s idle %ld KiB (x%.2f)\n",
        other.c_str(), Median(other_starts), Median(other_starts) / Median(starts), idle, other_rss,
        static_cast<double>(other_rss) / static_cast<double>(rss));
  }
  std::filesystem::remove_all(dir);
  return 0;
}
