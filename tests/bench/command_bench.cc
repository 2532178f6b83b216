// Prints the command figures of quality.md, measured side by side in one run against the dev
// gateway on loopback with the real bcd binary:
//   - round trip of a signed inventory.refresh (the cheapest kind in the table: no kind is
//     trivial), push to SUCCEEDED at the gateway, median and p99, one at a time; and, beside it,
//     what collecting the inventory alone costs in this process, so the rest is bcd's pipeline;
//   - commands per second sustained on one session (256 in flight);
//   - outbox appends per second to disk (each fsynced), in this process;
//   - RSS of bcd after every 20% of `rss_commands` commands (flat means bounded).
//
//   build/tests/bench/command_bench [round_trips=1000] [sustained=5000] [rss_commands=100000]

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "daemon/delivery/outbox.h"
#include "daemon/dispatch/dispatcher.h"
#include "modes/common/inventory.h"
#include "pki/envelope.h"
#include "proto/signing_input.h"
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

// Terminal updates the gateway has seen, by command id.
struct Finished {
  std::mutex mu;
  // When each state of the last command arrived (for the stage breakdown).
  Clock::time_point accepted, running;
  std::condition_variable cv;
  std::set<std::string> ids;
  std::size_t count = 0;
};

// A handler that does nothing: what the dispatcher itself costs.
class NoOp final : public bcd::CommandHandler {
 public:
  absl::StatusOr<std::string> Run(const v1::Command&, const google::protobuf::Message&,
                                  const std::atomic<bool>&) override {
    return std::string();
  }
};

// Median microseconds from Submit of a signed command to its terminal update, in this process,
// with a no-op handler: decode, dedup, signature with its chain, payload, lane hand-off, result
// store (one sync); and, apart, the signature check alone.
std::pair<double, double> DispatchInProcess(const DevPki& pki, const std::string& dir, int count) {
  bcd::ResultStore results = *bcd::ResultStore::Open(dir, std::time(nullptr));
  bcd::pki::TrustState trust =
      *bcd::pki::TrustState::FromFirstBundle(pki.SignedBundle(1), pki.join_service_key().Public());
  std::ostringstream sink;
  bcd::Logger log(&sink, bcd::LogLevel::kError);
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  bcd::Dispatcher dispatcher(
      bcd::proto::Mode::kNode, "bench", &results,
      bcd::DispatcherHooks{.update =
                               [&](const v1::CommandUpdate& u) {
                                 if (u.state() != v1::COMMAND_STATE_SUCCEEDED) return;
                                 std::lock_guard<std::mutex> lock(mu);
                                 ++done;
                                 cv.notify_all();
                               },
                           .now = [] { return static_cast<int64_t>(std::time(nullptr)); }},
      &log);
  if (absl::Status s = dispatcher.Register("inventory.refresh", std::make_unique<NoOp>());
      !s.ok()) {
    std::fprintf(stderr, "command_bench: %s\n", std::string(s.message()).c_str());
    std::exit(1);
  }
  std::vector<double> dispatch, verify;
  bcd::pki::ChainVerifier chains;  // remembers the chain, as the dispatcher's does
  for (int i = 0; i < count; ++i) {
    v1::Command command;
    command.set_command_id("d-" + std::to_string(i));
    command.set_node_id("bench");
    command.set_kind("inventory.refresh");
    command.set_issued_at(static_cast<uint64_t>(std::time(nullptr)));
    command.set_expires_at(static_cast<uint64_t>(std::time(nullptr)) + 3600);
    v1::SignedCommand signed_command = pki.SignCommand(command);
    auto start = Clock::now();
    (void)chains.Verify(
        bcd::proto::BodySigningInput(bcd::proto::Purpose::kCommand, signed_command.body()),
        signed_command.signature(), trust.command_signing_roots(), std::time(nullptr));
    verify.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    start = Clock::now();
    dispatcher.Submit(signed_command, trust, false);
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done == i + 1; });
    dispatch.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  return {Percentile(dispatch, 0.5), Percentile(verify, 0.5)};
}

}  // namespace

int main(int argc, char** argv) {
  int round_trips = argc > 1 ? std::atoi(argv[1]) : 1000;
  int sustained = argc > 2 ? std::atoi(argv[2]) : 5000;
  int rss_commands = argc > 3 ? std::atoi(argv[3]) : 100000;
  std::string bcd = BCD_BINARY;
  std::string pattern = "/tmp/bcd-bench-XXXXXX";
  std::string dir = mkdtemp(pattern.data());
  DevPki pki = *DevPki::Create(std::time(nullptr));
  Finished finished;
  bcd::testing::DevGatewayOptions options;
  options.on_frame = [&](const std::string&, const v1::AgentFrame& frame) {
    if (!frame.has_command_update()) return;
    v1::CommandState s = frame.command_update().state();
    std::lock_guard<std::mutex> lock(finished.mu);
    if (s == v1::COMMAND_STATE_ACCEPTED) finished.accepted = Clock::now();
    if (s == v1::COMMAND_STATE_RUNNING) finished.running = Clock::now();
    if (s == v1::COMMAND_STATE_ACCEPTED || s == v1::COMMAND_STATE_RUNNING) return;
    finished.ids.insert(frame.command_update().command_id());
    ++finished.count;
    finished.cv.notify_all();
  };
  auto gateway = *DevGateway::Start(pki, options);
  std::string config = dir + "/config.toml";
  std::ofstream(config) << gateway->ConfigToml(dir + "/state") << "log_level = \"warn\"\n";
  if (WaitChild(SpawnChild(
          {bcd, "join", "--config", config, "--token", gateway->AddJoinToken("bench")})) != 0) {
    return 1;
  }
  pid_t node = SpawnChild({bcd, "node", "--config", config});
  if (!gateway->WaitForWelcomes(1, std::chrono::seconds(30))) return 1;

  int next = 0;
  auto push = [&] {
    v1::Command command;
    command.set_command_id("b-" + std::to_string(next++));
    command.set_node_id("bench");
    command.set_kind("inventory.refresh");
    command.set_issued_at(static_cast<uint64_t>(std::time(nullptr)));
    command.set_expires_at(static_cast<uint64_t>(std::time(nullptr)) + 3600);
    v1::ServerFrame frame;
    *frame.mutable_command() = pki.SignCommand(command);
    gateway->Push("bench", frame);
    return command.command_id();
  };
  auto wait_count = [&](std::size_t count) {
    std::unique_lock<std::mutex> lock(finished.mu);
    return finished.cv.wait_for(lock, std::chrono::seconds(60),
                                [&] { return finished.count >= count; });
  };

  // Round trips, one at a time.
  std::vector<double> trips, to_accepted, to_running;
  auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  for (int i = 0; i < round_trips; ++i) {
    auto start = Clock::now();
    push();
    if (!wait_count(static_cast<std::size_t>(i + 1))) return std::fprintf(stderr, "stalled\n"), 1;
    auto end = Clock::now();
    trips.push_back(ms(end - start));
    std::lock_guard<std::mutex> lock(finished.mu);
    to_accepted.push_back(ms(finished.accepted - start));
    to_running.push_back(ms(finished.running - finished.accepted));
  }
  // What the handler's own work costs: the same collection, in this process.
  std::vector<double> collections;
  for (int i = 0; i < std::min(round_trips, 200); ++i) {
    auto start = Clock::now();
    (void)bcd::CollectInventory({.root = "/", .architecture = "x86_64"});
    collections.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }

  std::filesystem::create_directories(dir + "/dispatch");
  auto [dispatch_us, verify_us] = DispatchInProcess(pki, dir + "/dispatch", 500);

  // Sustained: 256 in flight.
  auto sustained_start = Clock::now();
  std::size_t base = static_cast<std::size_t>(next);
  for (int i = 0; i < sustained; ++i) {
    if (i >= 256) wait_count(base + static_cast<std::size_t>(i - 255));
    push();
  }
  wait_count(base + static_cast<std::size_t>(sustained));
  double sustained_s = std::chrono::duration<double>(Clock::now() - sustained_start).count();

  // Outbox appends to disk.
  std::filesystem::create_directories(dir + "/outbox");
  bcd::Outbox outbox = *bcd::Outbox::Open(dir + "/outbox");
  auto outbox_start = Clock::now();
  constexpr int kAppends = 2000;
  for (int i = 0; i < kAppends; ++i) {
    v1::AgentFrame frame;
    frame.mutable_command_update()->set_command_id("c-" + std::to_string(i));
    frame.mutable_command_update()->set_state(v1::COMMAND_STATE_SUCCEEDED);
    (void)outbox.Append(frame);
  }
  double outbox_s = std::chrono::duration<double>(Clock::now() - outbox_start).count();

  // RSS over many commands.
  std::vector<std::pair<int, long>> rss = {{0, RssKiB(node)}};
  base = static_cast<std::size_t>(next);
  for (int i = 0; i < rss_commands; ++i) {
    if (i >= 256) wait_count(base + static_cast<std::size_t>(i - 255));
    push();
    if ((i + 1) % std::max(1, rss_commands / 5) == 0) {
      wait_count(base + static_cast<std::size_t>(i + 1));
      rss.emplace_back(i + 1, RssKiB(node));
    }
  }
  kill(node, SIGTERM);
  WaitChild(node);

  std::printf("bcd %s, dev gateway on loopback, kind inventory.refresh, signed\n", bcd.c_str());
  std::printf("round trip, one at a time (%d): median %.3f ms, p99 %.3f ms\n", round_trips,
              Percentile(trips, 0.5), Percentile(trips, 0.99));
  std::printf(
      "  stages, median: push to ACCEPTED %.3f ms, to RUNNING +%.3f ms, to SUCCEEDED +%.3f\n",
      Percentile(to_accepted, 0.5), Percentile(to_running, 0.5),
      Percentile(trips, 0.5) - Percentile(to_accepted, 0.5) - Percentile(to_running, 0.5));
  std::printf("  collecting the inventory alone (same work, in process): median %.3f ms\n",
              Percentile(collections, 0.5));
  std::printf(
      "  in process, no-op handler, no transport: Submit to SUCCEEDED median %.0f us, of which "
      "the signature with its chain %.0f us\n",
      dispatch_us, verify_us);
  std::printf("sustained, 256 in flight: %d commands in %.2f s = %.0f commands/s\n", sustained,
              sustained_s, sustained / sustained_s);
  std::printf("outbox appends (fsync each): %d in %.2f s = %.0f /s\n", kAppends, outbox_s,
              kAppends / outbox_s);
  std::printf("RSS of bcd node:");
  for (const auto& [count, kib] : rss) std::printf(" %d:%ld KiB", count, kib);
  std::printf("\n");
  std::filesystem::remove_all(dir);
  return 0;
}
