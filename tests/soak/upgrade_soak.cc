// bcd-upgrade-soak: daemon.upgrade through `kill -9` at any moment.
//
//   bcd-upgrade-soak [--rounds N] [--seed X] [--bcd PATH] [--keep]
//
// bcd (stripped of its debug info) is installed in a temporary bin/ and run as `bcd node` by a
// supervisor loop that starts it again whenever no daemon runs (as systemd's Restart= would, but
// without ExecStartPre: the rollback is bcd's own). Each round stamps the next version
// (1.<round>.0), sends a signed daemon.upgrade, and after a random delay (from the seed, anywhere
// in the time an upgrade takes, which round 1 measures without a kill: the download, the check
// run, the swap, the re-execution and the trial all fall in it) SIGKILLs the daemon, its guard, or
// both. Then, within 90 s:
//   - a session is welcomed and no upgrade is left under way (bcd status shows none);
//   - the binary at bin/bcd and bin/bcd.previous are each byte for byte one of the releases
//     (never partial), and no download is left beside them;
//   - the version in session is the round's or the one before it, and the round's exactly when
//     the command was reported SUCCEEDED;
//   - a reported command has one terminal state.
// Prints each round's outcome and the figures; exits 1 on any violation.

#include <signal.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/files.h"
#include "config/config.h"
#include "daemon/identity/join.h"
#include "daemon/upgrade/release.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"
#include "pki/keys.h"
#include "testing/child_process.h"
#include "testing/dev_control.h"
#include "testing/dev_gateway.h"
#include "testing/dev_pki.h"
#include "testing/release_server.h"

namespace {

namespace fs = std::filesystem;
using bcd::testing::DevControlPlane;
using bcd::testing::DevGateway;
using bcd::testing::DevPki;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

std::string FileSha(const fs::path& path) {
  absl::StatusOr<std::string> bytes = bcd::ReadWholeFile(path, std::size_t{1} << 30);
  return bytes.ok() ? bcd::pki::Hex(bcd::pki::Sha256(*bytes)) : "missing";
}

// The PIDs running a binary of `bin`, split into daemons and guards.
void Processes(const fs::path& bin, std::vector<pid_t>* daemons, std::vector<pid_t>* guards) {
  for (const auto& entry : fs::directory_iterator("/proc")) {
    std::error_code ec;
    fs::path exe = fs::read_symlink(entry.path() / "exe", ec);
    if (ec || !exe.string().starts_with(bin.string())) continue;
    pid_t pid = std::atoi(entry.path().filename().c_str());
    std::ifstream cmdline(entry.path() / "cmdline");
    std::string args((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
    (args.find("upgrade-guard") != std::string::npos ? guards : daemons)->push_back(pid);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 20;
  uint64_t seed = std::random_device{}();
  std::string bcd = BCD_BINARY;
  bool keep = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--keep") {
      keep = true;
    } else if (i + 1 < argc && arg == "--rounds") {
      rounds = std::atoi(argv[++i]);
    } else if (i + 1 < argc && arg == "--seed") {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (i + 1 < argc && arg == "--bcd") {
      bcd = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: bcd-upgrade-soak [--rounds N] [--seed X] [--bcd PATH] [--keep]\n");
      return 2;
    }
  }
  std::mt19937_64 random(seed);
  utsname uts{};
  uname(&uts);
  std::string os_arch = bcd::upgrade::OsArch(uts.machine);
  std::string pattern = (fs::temp_directory_path() / "bcd-upgrade-soak-XXXXXX").string();
  fs::path dir = mkdtemp(pattern.data());
  fs::path bin = dir / "bin", releases = dir / "releases", state = dir / "state";
  fs::create_directories(bin);
  fs::create_directories(releases);
  auto shell = [](const std::string& command) { return bcd::testing::RunShell(command).status; };
  if (shell("objcopy --strip-debug " + bcd + " " + (bin / "bcd").string()) != 0) return 1;

  DevPki pki = *DevPki::Create(std::time(nullptr));
  auto gateway = *DevGateway::Start(pki, {});
  DevControlPlane control(&pki, gateway.get());
  bcd::pki::PrivateKey release_key = *bcd::pki::PrivateKey::Generate();
  (void)bcd::AtomicWriteFile(dir / "ca.pem", pki.serving_ca().Pem(), 0644);
  auto server = *bcd::testing::ReleaseServer::Start(releases, pki.serving_key().ToPem(),
                                                    pki.ServingChainPem());
  std::string config = (dir / "config.toml").string();
  std::ofstream(config) << gateway->ConfigToml(state) << "[update]\nrelease_keys = [\""
                        << bcd::pki::Hex(release_key.Public().SpkiSha256())
                        << "\"]\ntrial_seconds = 10\n";
  bcd::JoinSpec spec{.evidence = gateway->AddJoinToken("n-1"),
                     .now = [] { return static_cast<int64_t>(std::time(nullptr)); },
                     .sleep = [](std::chrono::seconds) {}};
  if (!bcd::JoinFleet(*bcd::Config::Load(config), spec).ok()) return 1;
  setenv("SSL_CERT_FILE", (dir / "ca.pem").c_str(), 1);

  // Every version's bytes, to tell a complete binary from anything else.
  std::map<std::string, std::string> versions;  // sha -> version
  versions[FileSha(bin / "bcd")] = "0.1.0";

  // The supervisor: starts `bin/bcd node` whenever no daemon runs (each one reaped by the same
  // loop: the daemon is its child until a guard restarts one).
  std::atomic<bool> stopping{false};
  std::atomic<int> starts{0};
  std::thread supervisor([&] {
    std::vector<pid_t> children;
    while (!stopping) {
      for (pid_t& child : children) {
        if (child > 0 && waitpid(child, nullptr, WNOHANG) == child) child = -1;
      }
      std::vector<pid_t> daemons, guards;
      Processes(bin, &daemons, &guards);
      if (daemons.empty() && guards.empty()) {
        children.push_back(
            bcd::testing::SpawnChild({"sh", "-c",
                                      "exec " + (bin / "bcd").string() + " node --config " +
                                          config + " 2>>" + (dir / "log.txt").string()}));
        ++starts;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    for (pid_t child : children) {
      if (child > 0) waitpid(child, nullptr, 0);
    }
  });

  auto hello_version = [&]() -> std::string {
    auto hello = gateway->LastHello("n-1");
    return hello ? hello->daemon_version() : "";
  };
  auto settle = [&](Clock::duration limit) {
    auto until = Clock::now() + limit;
    while (Clock::now() < until) {
      json status =
          json::parse(bcd::testing::RunShell((bin / "bcd").string() + " status --json --config " +
                                             config + " 2>/dev/null")
                          .out,
                      nullptr, false);
      if (status.is_object() && status["session"].is_object() &&
          status["session"].value("state", "") == "connected" &&
          status["upgrade"]["under_way"].is_null()) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return false;
  };
  int violations = 0;
  auto violated = [&](int round, const std::string& what) {
    std::printf("round %d: VIOLATION: %s\n", round, what.c_str());
    ++violations;
  };
  if (!settle(std::chrono::seconds(30))) violated(0, "the first node never came up");
  std::map<std::string, int> outcomes;
  std::vector<double> recover_ms;
  std::string current = "0.1.0";
  int span_ms = 1000;  // how long an upgrade takes, measured by round 1
  for (int round = 1; round <= rounds; ++round) {
    std::string version = "1." + std::to_string(round) + ".0";
    fs::path release = releases / ("bcd-" + version);
    shell(std::string(BCD_SOURCE_DIR) + "/scripts/stamp-version " + (dir / "bin" / "bcd").string() +
          " " + release.string() + " " + version);
    // Stamped from whatever bin/bcd is now: the same code, this round's version.
    versions[FileSha(release)] = version;
    bettercompute::agent::v1::DaemonUpgradePayload payload = DevPki::SignRelease(
        release_key, version, os_arch, *bcd::ReadWholeFile(release, std::size_t{1} << 30),
        server->Url(release.filename().string()));
    std::string payload_json;
    (void)google::protobuf::util::MessageToJsonString(payload, &payload_json);
    absl::StatusOr<std::string> answer = absl::UnknownError("not sent");
    std::thread sender([&] {
      answer = control.Run("n-1", "daemon.upgrade", payload_json, std::chrono::seconds(60));
    });
    // Round 1 is not killed: it measures how long an upgrade takes, and the kills of the later
    // rounds fall anywhere in that span (and a little after).
    int delay_ms = round == 1 ? -1 : static_cast<int>(random() % (span_ms * 6 / 5 + 1));
    int which = static_cast<int>(random() % 3);  // 0: the daemon, 1: the guard, 2: both
    auto sent_at = Clock::now();
    auto killed_at = sent_at;
    if (delay_ms >= 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      std::vector<pid_t> daemons, guards;
      Processes(bin, &daemons, &guards);
      killed_at = Clock::now();
      if (which != 1) {
        for (pid_t pid : daemons) kill(pid, SIGKILL);
      }
      if (which != 0) {
        for (pid_t pid : guards) kill(pid, SIGKILL);
      }
    }
    sender.join();
    if (round == 1) {
      span_ms = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - sent_at).count());
    }
    bool settled = settle(std::chrono::seconds(90));
    recover_ms.push_back(
        std::chrono::duration<double, std::milli>(Clock::now() - killed_at).count());
    std::string state_name = "no result";
    if (answer.ok()) state_name = json::parse(*answer).value("state", "?");
    outcomes[state_name]++;
    std::string running = hello_version();
    if (delay_ms < 0) {
      std::printf("round %d: %s, no kill (%d ms from the command to its result): %s, running %s\n",
                  round, version.c_str(), span_ms, state_name.c_str(), running.c_str());
    } else {
      std::printf("round %d: %s, kill -9 of the %s at %d ms: %s, running %s\n", round,
                  version.c_str(),
                  which == 0   ? "daemon"
                  : which == 1 ? "guard"
                               : "both",
                  delay_ms, state_name.c_str(), running.c_str());
    }
    std::fflush(stdout);
    if (!settled) violated(round, "no session, or an upgrade still under way, after 90 s");
    for (const fs::path& file : {bin / "bcd", bin / "bcd.previous"}) {
      if (!fs::exists(file) && file.filename() == "bcd.previous") continue;
      if (!versions.contains(FileSha(file))) violated(round, file.string() + " is not a release");
    }
    if (fs::exists(bin / ".bcd.download")) violated(round, "a download was left behind");
    if (running != version && running != current) {
      violated(round, "running " + running + ", neither " + current + " nor " + version);
    }
    if (state_name == "COMMAND_STATE_SUCCEEDED" && running != version) {
      violated(round, "SUCCEEDED, but " + running + " runs");
    }
    if (versions[FileSha(bin / "bcd")] != running) {
      violated(round, "bin/bcd is " + versions[FileSha(bin / "bcd")] + " but " + running + " runs");
    }
    current = running;
  }
  stopping = true;
  std::vector<pid_t> daemons, guards;
  Processes(bin, &daemons, &guards);
  for (pid_t pid : daemons) kill(pid, SIGTERM);
  for (pid_t pid : guards) kill(pid, SIGKILL);
  supervisor.join();
  std::sort(recover_ms.begin(), recover_ms.end());
  std::printf("\n%d rounds, seed %llu: ", rounds, static_cast<unsigned long long>(seed));
  for (const auto& [state, count] : outcomes) std::printf("%s %d, ", state.c_str(), count);
  std::printf("daemon starts by the supervisor %d\n", starts.load());
  if (!recover_ms.empty()) {
    std::printf("from the kill to a welcomed, settled node: median %.0f ms, max %.0f ms\n",
                recover_ms[recover_ms.size() / 2], recover_ms.back());
  }
  std::printf("replay: bcd-upgrade-soak --rounds %d --seed %llu\n", rounds,
              static_cast<unsigned long long>(seed));
  std::printf("%s\n", violations == 0 ? "no violation" : "VIOLATIONS");
  if (!keep && violations == 0)
    fs::remove_all(dir);
  else
    std::printf("files kept in %s\n", dir.c_str());
  return violations == 0 ? 0 : 1;
}
