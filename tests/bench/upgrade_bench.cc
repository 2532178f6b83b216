// upgrade_bench: the figures of daemon.upgrade, on the dev stack with real binaries.
//
//   upgrade_bench [UPGRADES] [DOWNLOAD_MIB]
//
// 1. UPGRADES upgrades in a row (1.1.0, 1.2.0, ...): the time from the old version's session end
//    to the new version's Welcome, and from the command to its SUCCEEDED result; medians.
// 2. The time from the command to its FAILED result for each failure kind (a release that exits at
//    once, one that hangs, one that cannot reach the gateway), with trial_seconds = 5.
// 3. Downloading and checking a DOWNLOAD_MIB MiB file from the HTTPS release server: bcd's
//    HttpGetToFile (sha256 while it streams) against `curl` then `sha256sum` of the same file, in
//    turns, 5 times each; medians and MiB/s.

#include <signal.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
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
#include "transport/http_client.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using bcd::testing::DevPki;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }
double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Shell(const std::string& command) { return bcd::testing::RunShell(command).status; }

}  // namespace

int main(int argc, char** argv) {
  int upgrades = argc > 1 ? std::atoi(argv[1]) : 5;
  int mib = argc > 2 ? std::atoi(argv[2]) : 256;
  std::string pattern = (fs::temp_directory_path() / "bcd-upgrade-bench-XXXXXX").string();
  fs::path dir = mkdtemp(pattern.data());
  fs::path bin = dir / "bin", releases = dir / "releases";
  fs::create_directories(bin);
  fs::create_directories(releases);
  if (Shell("objcopy --strip-debug " BCD_BINARY " " + (bin / "bcd").string()) != 0) return 1;
  utsname uts{};
  uname(&uts);
  std::string os_arch = bcd::upgrade::OsArch(uts.machine);

  DevPki pki = *DevPki::Create(std::time(nullptr));
  auto gateway = *bcd::testing::DevGateway::Start(pki, {});
  bcd::testing::DevControlPlane control(&pki, gateway.get());
  bcd::pki::PrivateKey key = *bcd::pki::PrivateKey::Generate();
  (void)bcd::AtomicWriteFile(dir / "ca.pem", pki.serving_ca().Pem(), 0644);
  auto server = *bcd::testing::ReleaseServer::Start(releases, pki.serving_key().ToPem(),
                                                    pki.ServingChainPem());
  std::string config = (dir / "config.toml").string();
  std::ofstream(config) << gateway->ConfigToml(dir / "state") << "[update]\nrelease_keys = [\""
                        << bcd::pki::Hex(key.Public().SpkiSha256()) << "\"]\ntrial_seconds = 5\n";
  bcd::JoinSpec spec{.evidence = gateway->AddJoinToken("n-1"),
                     .now = [] { return static_cast<int64_t>(std::time(nullptr)); },
                     .sleep = [](std::chrono::seconds) {}};
  if (!bcd::JoinFleet(*bcd::Config::Load(config), spec).ok()) return 1;
  setenv("SSL_CERT_FILE", (dir / "ca.pem").c_str(), 1);
  pid_t node = bcd::testing::SpawnChild({"sh", "-c",
                                         "exec " + (bin / "bcd").string() + " node --config " +
                                             config + " 2>>" + (dir / "log.txt").string()});
  auto hello_is = [&](const std::string& version, std::chrono::seconds limit) {
    auto until = Clock::now() + limit;
    while (Clock::now() < until) {
      auto hello = gateway->LastHello("n-1");
      if (hello && hello->daemon_version() == version && !gateway->SessionNodes().empty())
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  };
  if (!hello_is("0.1.0", std::chrono::seconds(30))) return 1;
  auto send = [&](const fs::path& release, const std::string& version) {
    bettercompute::agent::v1::DaemonUpgradePayload payload = DevPki::SignRelease(
        key, version, os_arch, *bcd::ReadWholeFile(release, std::size_t{1} << 30),
        server->Url(release.filename().string()));
    std::string json;
    (void)google::protobuf::util::MessageToJsonString(payload, &json);
    absl::StatusOr<std::string> answer =
        control.Run("n-1", "daemon.upgrade", json, std::chrono::seconds(120));
    return answer.ok() ? nlohmann::json::parse(*answer).value("state", "?") : "no result";
  };

  std::printf("upgrade_bench: %d upgrades, a %d MiB download; bcd stripped: %ju bytes\n\n",
              upgrades, mib, static_cast<uintmax_t>(fs::file_size(bin / "bcd")));
  std::vector<double> gap_ms, total_ms;
  for (int i = 1; i <= upgrades; ++i) {
    std::string version = "1." + std::to_string(i) + ".0";
    fs::path release = releases / ("bcd-" + version);
    Shell(std::string(BCD_SOURCE_DIR) + "/scripts/stamp-version " + (bin / "bcd").string() + " " +
          release.string() + " " + version);
    Clock::time_point ended{}, welcomed{};
    std::thread watch([&] {
      gateway->WaitForNoSession("n-1", std::chrono::seconds(60));
      ended = Clock::now();
      if (hello_is(version, std::chrono::seconds(60))) welcomed = Clock::now();
    });
    auto start = Clock::now();
    std::string state = send(release, version);
    auto done = Clock::now();
    watch.join();
    gap_ms.push_back(Ms(welcomed - ended));
    total_ms.push_back(Ms(done - start));
    std::printf("  %s: %s, session end to Welcome %.0f ms, command to result %.0f ms\n",
                version.c_str(), state.c_str(), gap_ms.back(), total_ms.back());
  }
  std::printf(
      "upgrade: old session's end to the new version's Welcome, median %.0f ms; command "
      "to SUCCEEDED, median %.0f ms\n\n",
      Median(gap_ms), Median(total_ms));

  std::string running = "1." + std::to_string(upgrades) + ".0";
  auto script = [&](const std::string& name, const std::string& then) {
    fs::path path = releases / ("bcd-" + name);
    std::ofstream(path) << "#!/bin/sh\nif [ \"$1\" = --version ]; then echo \"bcd 9.0.0\"; exit 0; "
                           "fi\n"
                        << then << "\n";
    return path;
  };
  std::string broken = (dir / "broken.toml").string();
  {
    std::string text = *bcd::ReadWholeFile(config, 1 << 20);
    std::string from = "127.0.0.1:" + std::to_string(gateway->port());
    text.replace(text.find(from), from.size(),
                 "127.0.0.1:" + std::to_string(bcd::testing::FreeLoopbackPort()));
    std::ofstream(broken) << text;
  }
  fs::path real = bin / "bcd-real-9.0.0";
  Shell(std::string(BCD_SOURCE_DIR) + "/scripts/stamp-version " + (bin / "bcd").string() + " " +
        real.string() + " 9.0.0");
  struct Kind {
    const char* name;
    fs::path release;
  };
  for (const Kind& kind :
       {Kind{"exits at once", script("exits", "exit 0")},
        Kind{"hangs", script("hangs", "exec sleep 600")},
        Kind{"cannot dial",
             script("cannot-dial", "exec " + real.string() + " node --config " + broken)}}) {
    auto start = Clock::now();
    std::string state = send(kind.release, "9.0.0");
    double ms = Ms(Clock::now() - start);
    bool back = hello_is(running, std::chrono::seconds(60));
    std::printf("rollback, a release that %s: %s after %.0f ms%s\n", kind.name, state.c_str(), ms,
                back ? ", the old version welcomed again" : ", NOT BACK");
  }
  std::printf("  (trial_seconds = 5; the guard steps in 10 s after the deadline)\n\n");

  // The download: the same file, bcd's client and curl + sha256sum in turns.
  {
    std::vector<char> block(1 << 20);
    std::mt19937_64 random(1);
    for (char& c : block) c = static_cast<char>(random());
    std::ofstream big(releases / "big", std::ios::binary);
    for (int i = 0; i < mib; ++i)
      big.write(block.data(), static_cast<std::streamsize>(block.size()));
  }
  std::vector<double> ours, theirs;
  for (int i = 0; i < 5; ++i) {
    auto start = Clock::now();
    absl::StatusOr<bcd::Downloaded> got = bcd::HttpGetToFile(
        {.url = server->Url("big"), .file = dir / "got", .max_bytes = uint64_t{1} << 34});
    ours.push_back(Ms(Clock::now() - start));
    if (!got.ok()) {
      std::printf("download failed: %s\n", std::string(got.status().message()).c_str());
      break;
    }
    fs::remove(dir / "got");
    start = Clock::now();
    Shell("curl -s --cacert " + (dir / "ca.pem").string() + " -o " + (dir / "curl").string() + " " +
          server->Url("big") + " && sha256sum " + (dir / "curl").string() + " >/dev/null");
    theirs.push_back(Ms(Clock::now() - start));
    fs::remove(dir / "curl");
  }
  double a = Median(ours), b = Median(theirs);
  std::printf(
      "download and verify %d MiB: bcd %.0f ms (%.0f MiB/s), curl + sha256sum %.0f ms "
      "(%.0f MiB/s), ratio %.2f\n",
      mib, a, mib / (a / 1000), b, mib / (b / 1000), b / a);
  for (const auto& entry : fs::directory_iterator("/proc")) {
    std::error_code ec;
    if (fs::read_symlink(entry.path() / "exe", ec).string().starts_with(bin.string()))
      kill(std::atoi(entry.path().filename().c_str()), SIGKILL);
  }
  waitpid(node, nullptr, 0);
  fs::remove_all(dir);
  return 0;
}
