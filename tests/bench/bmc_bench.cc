// Prints the BMC figures, measured side by side in one run: the median round trip of
// bmc.powerStatus through bcd (command pushed by the dev gateway to terminal update received) over
// Redfish (the emulator, testing/bmc/redfish_bmc.py) and over IPMI (Debian's ipmi_sim), beside
// redfishtool and ipmitool asking the same BMCs alone; the cost of falling back to IPMI where
// Redfish is not served (an unspecified protocol against an explicit one); and 20 BMCs asked at
// once against one.
//
//   build/tests/bench/bmc_bench [rounds=15] [bmcs=20]

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <sstream>
#include <thread>
#include <vector>

#include "base/subprocess.h"
#include "bettercompute/site/v1/site.pb.h"
#include "daemon/agent.h"
#include "daemon/identity/join.h"
#include "modes/site/site_mode.h"
#include "testing/bmc_emulators.h"
#include "testing/dev_gateway.h"

namespace {

namespace v1 = bettercompute::agent::v1;
namespace site = bettercompute::site::v1;
using bcd::testing::DevGateway;
using bcd::testing::DevPki;
using Clock = std::chrono::steady_clock;

constexpr char kPassword[] = "bench-pass-1";

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double Ms(Clock::time_point since) {
  return std::chrono::duration<double, std::milli>(Clock::now() - since).count();
}

struct Bench {
  DevPki* pki;
  DevGateway* gateway;
  int next = 0;

  std::string Send(const site::BmcTarget& target) {
    site::BmcPowerPayload payload;
    *payload.mutable_bmc() = target;
    std::string id = "b-" + std::to_string(next++);
    v1::Command command = DevPki::MakeCommand(id, "n-1", "bmc.powerStatus", std::time(nullptr));
    command.set_workflow_id("wf");
    command.set_step_id("step");
    command.set_payload(payload.SerializeAsString());
    v1::ServerFrame frame;
    *frame.mutable_command() = pki->SignCommand(command);
    gateway->Push("n-1", frame);
    return id;
  }
  // Waits for the terminal update of each of `ids`; false when one did not succeed.
  bool Wait(const std::vector<std::string>& ids) {
    auto deadline = Clock::now() + std::chrono::seconds(120);
    while (Clock::now() < deadline) {
      std::size_t done = 0, good = 0;
      for (const std::string& id : ids) {
        for (const auto& f : gateway->Received("n-1")) {
          if (!f.has_command_update() || f.command_update().command_id() != id) continue;
          v1::CommandState s = f.command_update().state();
          if (s == v1::COMMAND_STATE_ACCEPTED || s == v1::COMMAND_STATE_RUNNING) continue;
          ++done;
          if (s == v1::COMMAND_STATE_SUCCEEDED) {
            ++good;
          } else {
            std::fprintf(stderr, "%s: %s\n", id.c_str(), f.command_update().message().c_str());
          }
        }
      }
      if (done == ids.size()) return good == ids.size();
      gateway->WaitForReceived("n-1", gateway->Received("n-1").size() + 1,
                               std::chrono::milliseconds(50));
    }
    return false;
  }
  double RoundTrip(const site::BmcTarget& target) {
    auto start = Clock::now();
    if (!Wait({Send(target)})) return -1;
    return Ms(start);
  }
};

site::BmcTarget Target(const std::string& address, site::BmcProtocol protocol,
                       const std::string& pin = "") {
  site::BmcTarget target;
  target.set_address(address);
  target.set_credential_ref("bmc");
  target.set_protocol(protocol);
  target.set_tls_spki_sha256(pin);
  return target;
}

// The median of `rounds` runs of a tool (its own process each time).
double ToolMedian(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                  int rounds) {
  std::vector<double> times;
  for (int i = 0; i < rounds; ++i) {
    auto start = Clock::now();
    absl::StatusOr<bcd::ToolRun> run = bcd::RunTool(argv, env, std::chrono::seconds(30));
    if (!run.ok() || run->exit_code != 0) {
      std::fprintf(stderr, "%s failed: %s\n", argv[0].c_str(),
                   run.ok() ? run->output.c_str() : std::string(run.status().message()).c_str());
      return -1;
    }
    times.push_back(Ms(start));
  }
  return Median(times);
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = argc > 1 ? std::atoi(argv[1]) : 15;
  int count = argc > 2 ? std::atoi(argv[2]) : 20;
  std::string pattern = "/tmp/bcd-bmc-bench-XXXXXX";
  std::filesystem::path dir = mkdtemp(pattern.data());

  auto redfish = *bcd::testing::RedfishBmc::Start(dir / "redfish", {.password = kPassword});
  int port = redfish->port();
  auto ipmi = *bcd::testing::IpmiBmc::Start(dir / "ipmi", "admin", kPassword, "127.0.0.2", port);
  std::vector<std::unique_ptr<bcd::testing::RedfishBmc>> many;
  for (int i = 0; i < count; ++i) {
    many.push_back(*bcd::testing::RedfishBmc::Start(dir / ("many-" + std::to_string(i)),
                                                    {.password = kPassword}));
  }

  DevPki pki = *DevPki::Create(std::time(nullptr));
  auto gateway = *DevGateway::Start(pki, {});
  std::string toml =
      gateway->ConfigToml(dir / "state") + "[site]\nbmc_redfish_port = " + std::to_string(port) +
      "\nbmc_ipmi_port = " + std::to_string(port) + "\nbmc_tls_unverified = [\"127.0.0.2\"]\n";
  bcd::Config config = *bcd::Config::Parse(toml, "bench.toml");
  auto now = [] { return static_cast<int64_t>(std::time(nullptr)); };
  if (!bcd::JoinFleet(config, {.evidence = gateway->AddJoinToken("n-1"),
                               .now = now,
                               .sleep = [](std::chrono::seconds) {}})
           .ok()) {
    return 1;
  }
  std::ostringstream sink;
  bcd::Logger log(&sink, bcd::LogLevel::kError);
  auto daemon = *bcd::Agent::Create(config, std::make_unique<bcd::SiteMode>(),
                                    {.now = now, .uniform01 = [] { return 0.5; }, .log = &log});
  std::thread runner([&] { (void)daemon->Run(); });
  gateway->WaitForReceived("n-1", 1, std::chrono::seconds(30));
  gateway->AddSecret("bmc", std::string("admin:") + kPassword, {"wf", "step", ""});
  Bench bench{&pki, gateway.get()};

  site::BmcTarget over_redfish =
      Target(redfish->address(), site::BMC_PROTOCOL_REDFISH, redfish->spki_sha256());
  site::BmcTarget over_ipmi = Target(ipmi->address(), site::BMC_PROTOCOL_IPMI);
  site::BmcTarget fallback = Target("127.0.0.2", site::BMC_PROTOCOL_AUTO);
  bench.RoundTrip(over_redfish);  // warm: the secret client, the lane threads
  std::vector<double> r_bcd, i_bcd, f_bcd;
  for (int i = 0; i < rounds; ++i) {
    r_bcd.push_back(bench.RoundTrip(over_redfish));
    i_bcd.push_back(bench.RoundTrip(over_ipmi));
    f_bcd.push_back(bench.RoundTrip(fallback));
  }
  double r_tool =
      ToolMedian({"redfishtool", "-r", redfish->address(), "-u", "admin", "-p", kPassword, "-S",
                  "Always", "-P", "PowerState", "Systems", "-I", "1", "get"},
                 {}, rounds);
  double i_tool =
      ToolMedian({"ipmitool", "-I", "lanplus", "-H", "127.0.0.2", "-p", std::to_string(port), "-U",
                  "admin", "-E", "-C", "3", "chassis", "power", "status"},
                 {std::string("IPMI_PASSWORD=") + kPassword}, rounds);

  // One BMC, then `count` BMCs at once.
  std::vector<double> one, all;
  for (int r = 0; r < 3; ++r) {
    one.push_back(bench.RoundTrip(
        Target(many[0]->address(), site::BMC_PROTOCOL_REDFISH, many[0]->spki_sha256())));
    auto start = Clock::now();
    std::vector<std::string> ids;
    for (const auto& bmc : many) {
      ids.push_back(
          bench.Send(Target(bmc->address(), site::BMC_PROTOCOL_REDFISH, bmc->spki_sha256())));
    }
    if (!bench.Wait(ids)) return 1;
    all.push_back(Ms(start));
  }

  std::printf("bmc.powerStatus median round trip, %d rounds (ms):\n", rounds);
  std::printf("  Redfish: bcd %.1f   redfishtool alone %.1f   ratio %.2f\n", Median(r_bcd), r_tool,
              Median(r_bcd) / r_tool);
  std::printf("  IPMI:    bcd %.1f   ipmitool alone %.1f   ratio %.2f\n", Median(i_bcd), i_tool,
              Median(i_bcd) / i_tool);
  std::printf(
      "  unspecified protocol where Redfish is not served (IPMI after the refusal): %.1f"
      " (+%.1f over IPMI named)\n",
      Median(f_bcd), Median(f_bcd) - Median(i_bcd));
  std::printf("%d BMCs at once: wall %.1f ms vs one BMC %.1f ms (ratio %.2f; medians of 3)\n",
              count, Median(all), Median(one), Median(all) / Median(one));
  daemon->Stop();
  runner.join();
  std::filesystem::remove_all(dir);
  return 0;
}
