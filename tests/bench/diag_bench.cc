// Prints what the metrics registry and the diagnostics listener cost, measured side by side in one
// run: two real bcd node processes on one dev gateway, one with [diag] listen (scraped once a
// second while it works, as Prometheus would) and one without, take turns at:
//   - commands per second sustained on one session (256 in flight), each round on both;
//   - idle RSS after the runs;
// and, on the one with [diag]:
//   - the latency of a scrape of /metrics (connect, GET, whole answer), median and p99, and its
//     size;
// and, in this process, what counting costs: one bound counter add, one add by label values, and
// one rendering of a registry the size of the daemon's.
//
//   build/tests/bench/diag_bench [commands_per_round=3000] [rounds=3] [scrapes=500]

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/metrics.h"
#include "testing/child_process.h"
#include "testing/dev_gateway.h"

namespace {

namespace v1 = bettercompute::agent::v1;
using bcd::testing::DevGateway;
using bcd::testing::DevPki;
using bcd::testing::SpawnChild;
using bcd::testing::WaitChild;
using Clock = std::chrono::steady_clock;

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

long RssKiB(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return 0;
}

// GET /metrics over a fresh connection: the whole answer, "" on failure.
std::string Scrape(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string answer;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    std::string request = "GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n";
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buffer[16384];
      for (ssize_t n; (n = read(fd, buffer, sizeof buffer)) > 0;) {
        answer.append(buffer, static_cast<std::size_t>(n));
      }
    }
  }
  close(fd);
  return answer;
}

// The terminal updates the gateway has seen, per node.
struct Finished {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::size_t> count;
};

void CountingCosts() {
  bcd::Metrics metrics;
  bcd::AddProcessMetrics(metrics);
  bcd::CounterFamily& family = metrics.Counter("bench_total", "bench", {"case"});
  bcd::Counter bound = family.Bind({"command_update"});
  constexpr int kAdds = 5'000'000;
  auto start = Clock::now();
  for (int i = 0; i < kAdds; ++i) bound.Add();
  double bound_ns = std::chrono::duration<double, std::nano>(Clock::now() - start).count() / kAdds;
  start = Clock::now();
  for (int i = 0; i < kAdds / 10; ++i) family.Add({"command_update"});
  double labelled_ns =
      std::chrono::duration<double, std::nano>(Clock::now() - start).count() / (kAdds / 10);
  // A registry the daemon's size: about 30 families and 120 series.
  for (int f = 0; f < 30; ++f) {
    bcd::CounterFamily& other =
        metrics.Counter("bench_family_" + std::to_string(f) + "_total", "bench", {"case"});
    for (int s = 0; s < 4; ++s) other.Add({"series-" + std::to_string(s)});
  }
  std::vector<double> renders;
  std::size_t bytes = 0;
  for (int i = 0; i < 2000; ++i) {
    start = Clock::now();
    bytes = metrics.Text().size();
    renders.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  std::printf(
      "counting: bound add %.1f ns, add by label values %.1f ns; rendering %zu bytes "
      "(30 families, 120 series + process) %.1f us median\n",
      bound_ns, labelled_ns, bytes, Percentile(renders, 0.5));
}

}  // namespace

int main(int argc, char** argv) {
  int per_round = argc > 1 ? std::atoi(argv[1]) : 3000;
  int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
  int scrapes = argc > 3 ? std::atoi(argv[3]) : 500;
  CountingCosts();

  std::string bcd = BCD_BINARY;
  std::string pattern = "/tmp/bcd-diag-bench-XXXXXX";
  std::string dir = mkdtemp(pattern.data());
  DevPki pki = *DevPki::Create(std::time(nullptr));
  Finished finished;
  bcd::testing::DevGatewayOptions options;
  options.on_frame = [&](const std::string& node, const v1::AgentFrame& frame) {
    if (!frame.has_command_update()) return;
    v1::CommandState s = frame.command_update().state();
    if (s == v1::COMMAND_STATE_ACCEPTED || s == v1::COMMAND_STATE_RUNNING) return;
    std::lock_guard<std::mutex> lock(finished.mu);
    ++finished.count[node];
    finished.cv.notify_all();
  };
  auto gateway = *DevGateway::Start(pki, options);
  int port = bcd::testing::FreeLoopbackPort();
  std::map<std::string, pid_t> nodes;
  for (const std::string id : {"diag-on", "diag-off"}) {
    std::string config = dir + "/" + id + ".toml";
    std::ofstream(config) << gateway->ConfigToml(dir + "/" + id) << "log_level = \"warn\"\n"
                          << (id == "diag-on"
                                  ? "[diag]\nlisten = \"127.0.0.1:" + std::to_string(port) + "\"\n"
                                  : "");
    if (WaitChild(SpawnChild(
            {bcd, "join", "--config", config, "--token", gateway->AddJoinToken(id)})) != 0) {
      return 1;
    }
    nodes[id] = SpawnChild({bcd, "node", "--config", config});
  }
  if (!gateway->WaitForWelcomes(2, std::chrono::seconds(30)) ||
      !bcd::testing::WaitForLoopbackPort(static_cast<uint16_t>(port))) {
    return std::fprintf(stderr, "diag_bench: the nodes did not come up\n"), 1;
  }
  std::this_thread::sleep_for(std::chrono::seconds(2));
  std::map<std::string, long> idle_before;
  for (const auto& [id, pid] : nodes) idle_before[id] = RssKiB(pid);

  int next = 0;
  auto push = [&](const std::string& node) {
    v1::Command command;
    command.set_command_id("b-" + std::to_string(next++));
    command.set_node_id(node);
    command.set_kind("inventory.refresh");
    command.set_issued_at(static_cast<uint64_t>(std::time(nullptr)));
    command.set_expires_at(static_cast<uint64_t>(std::time(nullptr)) + 3600);
    v1::ServerFrame frame;
    *frame.mutable_command() = pki.SignCommand(command);
    gateway->Push(node, frame);
  };
  // Commands per second on `node`: per_round commands, 256 in flight.
  auto sustained = [&](const std::string& node) {
    std::size_t base;
    {
      std::lock_guard<std::mutex> lock(finished.mu);
      base = finished.count[node];
    }
    auto start = Clock::now();
    for (int sent = 0; sent < per_round;) {
      {
        std::unique_lock<std::mutex> lock(finished.mu);
        finished.cv.wait(
            lock, [&] { return static_cast<int>(sent - (finished.count[node] - base)) < 256; });
      }
      push(node);
      ++sent;
    }
    std::unique_lock<std::mutex> lock(finished.mu);
    finished.cv.wait(lock, [&] { return finished.count[node] - base >= std::size_t(per_round); });
    return per_round / std::chrono::duration<double>(Clock::now() - start).count();
  };
  // Prometheus' part: a scrape a second of the diag node while the rounds run.
  std::atomic<bool> done{false};
  std::thread scraper([&] {
    while (!done) {
      (void)Scrape(port);
      for (int i = 0; i < 10 && !done; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  std::map<std::string, std::vector<double>> rates;
  for (int r = 0; r < rounds; ++r) {
    // Alternate which goes first: neither always gets the warmer machine.
    std::vector<std::string> order = r % 2 == 0 ? std::vector<std::string>{"diag-on", "diag-off"}
                                                : std::vector<std::string>{"diag-off", "diag-on"};
    for (const std::string& id : order) rates[id].push_back(sustained(id));
  }
  done = true;
  scraper.join();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  for (const std::string id : {"diag-on", "diag-off"}) {
    std::printf("%-8s commands/s median %.0f (rounds:", id.c_str(), Percentile(rates[id], 0.5));
    for (double rate : rates[id]) std::printf(" %.0f", rate);
    std::printf("); idle RSS %ld KiB before the runs, %ld KiB after\n", idle_before[id],
                RssKiB(nodes[id]));
  }
  std::printf("ratio diag-on/diag-off commands/s: %.3f\n",
              Percentile(rates["diag-on"], 0.5) / Percentile(rates["diag-off"], 0.5));

  std::vector<double> latency;
  std::size_t size = 0;
  for (int i = 0; i < scrapes; ++i) {
    auto start = Clock::now();
    std::string answer = Scrape(port);
    latency.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    if (answer.rfind("HTTP/1.1 200", 0) != 0) return std::fprintf(stderr, "a scrape failed\n"), 1;
    size = answer.size();
  }
  std::printf("scrape of /metrics (%zu bytes with headers): median %.0f us, p99 %.0f us\n", size,
              Percentile(latency, 0.5), Percentile(latency, 0.99));
  for (const auto& [id, pid] : nodes) {
    kill(pid, SIGTERM);
    WaitChild(pid);
  }
  std::filesystem::remove_all(dir);
  return 0;
}
