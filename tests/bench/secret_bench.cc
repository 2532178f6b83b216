// Prints the secret figures of quality.md: median round trip of a secret (request to plaintext in
// hand: key generation, node_sig, the session, the broker, the JWE opened and checked) with bcd's
// secret client against the dev gateway on loopback, and secrets per second with 1 and 4 callers.
//
//   build/tests/bench/secret_bench [round_trips=500] [per_caller=250]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <sstream>
#include <thread>
#include <vector>

#include "daemon/agent.h"
#include "daemon/identity/join.h"
#include "daemon/secrets/secrets.h"
#include "modes/node/node_mode.h"
#include "testing/dev_gateway.h"

namespace {

using bcd::testing::DevGateway;
using bcd::testing::DevPki;
using Clock = std::chrono::steady_clock;

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  int round_trips = argc > 1 ? std::atoi(argv[1]) : 500;
  int per_caller = argc > 2 ? std::atoi(argv[2]) : 250;
  std::string pattern = "/tmp/bcd-secret-bench-XXXXXX";
  std::filesystem::path dir = mkdtemp(pattern.data());
  DevPki pki = *DevPki::Create(std::time(nullptr));
  auto gateway = *DevGateway::Start(pki, {});
  bcd::Config config = *bcd::Config::Parse(gateway->ConfigToml(dir / "state"), "bench.toml");
  auto now = [] { return static_cast<int64_t>(std::time(nullptr)); };
  if (!bcd::JoinFleet(config, {.evidence = gateway->AddJoinToken("n-1"),
                               .now = now,
                               .sleep = [](std::chrono::seconds) {}})
           .ok()) {
    return 1;
  }
  std::ostringstream sink;
  bcd::Logger log(&sink, bcd::LogLevel::kError);
  auto daemon = *bcd::Agent::Create(config, std::make_unique<bcd::NodeMode>(),
                                    {.now = now, .uniform01 = [] { return 0.5; }, .log = &log});
  std::thread runner([&] { (void)daemon->Run(); });
  gateway->WaitForReceived("n-1", 1, std::chrono::seconds(30));
  gateway->AddSecret("secret://bench", std::string(64, 'x'), {"wf", "step", ""});
  bcd::SecretBinding binding{"wf", "step", ""};

  std::vector<double> trips;
  for (int i = 0; i < round_trips; ++i) {
    auto start = Clock::now();
    if (!daemon->secrets().Resolve("secret://bench", binding).ok()) return 1;
    trips.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  double rates[2] = {0, 0};
  int callers[2] = {1, 4};
  for (int c = 0; c < 2; ++c) {
    auto start = Clock::now();
    std::vector<std::thread> threads;
    for (int t = 0; t < callers[c]; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < per_caller; ++i)
          (void)daemon->secrets().Resolve("secret://bench", binding);
      });
    }
    for (std::thread& t : threads) t.join();
    rates[c] =
        callers[c] * per_caller / std::chrono::duration<double>(Clock::now() - start).count();
  }
  daemon->Stop();
  runner.join();
  std::printf("secret round trip, dev gateway on loopback (%d): median %.3f ms, p99 %.3f ms\n",
              round_trips, Percentile(trips, 0.5), Percentile(trips, 0.99));
  std::printf("secrets per second: %.0f with 1 caller, %.0f with 4 callers\n", rates[0], rates[1]);
  std::filesystem::remove_all(dir);
  return 0;
}
