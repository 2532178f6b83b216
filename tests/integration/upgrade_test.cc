// daemon.upgrade end to end: real bcd binaries of two versions (the second stamped with
// scripts/stamp-version), installed in a temporary bin/, a release server over HTTPS, the dev
// gateway and control plane. The node runs as a child process and replaces itself; what it reports
// after its restart is read at the gateway.

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "base/files.h"
#include "base/version.h"
#include "config/config.h"
#include "daemon/identity/join.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "pki/keys.h"
#include "testing/child_process.h"
#include "testing/dev_control.h"
#include "testing/dev_gateway.h"
#include "testing/dev_pki.h"
#include "testing/release_server.h"
#include "tests/unit/fake_root.h"

namespace bcd {
namespace {

namespace v1 = bettercompute::agent::v1;
using json = nlohmann::json;
using testing::DevControlPlane;
using testing::DevGateway;
using testing::DevPki;

constexpr char kNext[] = "0.2.0";

std::string FileSha(const std::filesystem::path& path) {
  absl::StatusOr<std::string> bytes = ReadWholeFile(path, std::size_t{1} << 30);
  return bytes.ok() ? pki::Hex(pki::Sha256(*bytes)) : "missing";
}

std::string OsArchHere() {
#if defined(__x86_64__)
  return "linux/amd64";
#else
  return "linux/arm64";
#endif
}

class Upgrade : public ::testing::Test {
 protected:
  // The gateway, bcd installed in bin/ (without its debug info: smaller, the same code), the
  // release 0.2.0 stamped from it, the release server, and node n-1 joined with `update` as its
  // [update] table.
  void Install(const std::string& update) {
    pki_ = std::make_unique<DevPki>(*DevPki::Create(std::time(nullptr)));
    gateway_ = *DevGateway::Start(*pki_, {});
    control_ = std::make_unique<DevControlPlane>(pki_.get(), gateway_.get());
    std::filesystem::create_directories(bin());
    std::filesystem::create_directories(releases());
    ASSERT_EQ(Shell("objcopy --strip-debug " + std::string(BCD_BINARY) + " " + binary().string()),
              0);
    ASSERT_EQ(Shell(std::string(BCD_SOURCE_DIR) + "/scripts/stamp-version " + binary().string() +
                    " " + Release(kNext).string() + " " + kNext),
              0);
    old_sha_ = FileSha(binary());
    ASSERT_TRUE(AtomicWriteFile(dir_.path() / "ca.pem", pki_->serving_ca().Pem(), 0644).ok());
    releases_ = *testing::ReleaseServer::Start(releases(), pki_->serving_key().ToPem(),
                                               pki_->ServingChainPem());
    config_ = (dir_.path() / "config.toml").string();
    std::ofstream(config_) << gateway_->ConfigToml(state()) << update;
    Config config = *Config::Load(config_);
    JoinSpec spec{.evidence = gateway_->AddJoinToken("n-1"),
                  .now = [] { return static_cast<int64_t>(std::time(nullptr)); },
                  .sleep = [](std::chrono::seconds) {}};
    ASSERT_TRUE(JoinFleet(config, spec).ok());
  }
  std::string PinnedUpdate(const std::string& more = "trial_seconds = 5\n") const {
    return "[update]\nrelease_keys = [\"" + pki::Hex(release_key_.Public().SpkiSha256()) + "\"]\n" +
           more;
  }

  void TearDown() override {
    // Every process running a binary of bin/ (the node, a guard, a node a guard restarted).
    for (int round = 0; round < 2; ++round) {
      for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
        std::error_code ec;
        std::filesystem::path exe = std::filesystem::read_symlink(entry.path() / "exe", ec);
        if (!ec && exe.string().starts_with(bin().string())) {
          kill(std::atoi(entry.path().filename().c_str()), SIGKILL);
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (node_ > 0) testing::WaitChild(node_, std::chrono::seconds(10));
    if (proxy_ > 0) {
      kill(proxy_, SIGTERM);
      testing::WaitChild(proxy_, std::chrono::seconds(10));
    }
    unsetenv("SSL_CERT_FILE");
  }

  std::filesystem::path bin() const { return dir_.path() / "bin"; }
  std::filesystem::path binary() const { return bin() / "bcd"; }
  std::filesystem::path releases() const { return dir_.path() / "releases"; }
  std::filesystem::path state() const { return dir_.path() / "state"; }
  std::filesystem::path Release(const std::string& name) const {
    return releases() / ("bcd-" + name);
  }
  static int Shell(const std::string& command) { return testing::RunShell(command).status; }

  // Starts the installed bcd node (its log in log.txt) and waits for its Hello.
  void StartNode() {
    setenv("SSL_CERT_FILE", (dir_.path() / "ca.pem").c_str(), 1);
    node_ = testing::SpawnChild({"sh", "-c",
                                 "exec " + binary().string() + " node --config " + config_ +
                                     " 2>>" + (dir_.path() / "log.txt").string()});
    ASSERT_TRUE(WaitForHello(Version()));
  }
  // Waits until a session of n-1 said `version` in its Hello.
  bool WaitForHello(std::string_view version,
                    std::chrono::seconds limit = std::chrono::seconds(30)) {
    auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      auto hello = gateway_->LastHello("n-1");
      if (hello && hello->daemon_version() == version && !gateway_->SessionNodes().empty()) {
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  std::string Log() const { return *ReadWholeFile(dir_.path() / "log.txt", 1 << 24); }

  // A release of the file at `path` as `version`, signed for this machine by the pinned key.
  v1::DaemonUpgradePayload Signed(const std::filesystem::path& path, const std::string& version,
                                  const std::string& os_arch = OsArchHere()) const {
    return DevPki::SignRelease(release_key_, version, os_arch,
                               *ReadWholeFile(path, std::size_t{1} << 30),
                               releases_->Url(path.filename().string()));
  }
  // Sends daemon.upgrade and waits for its terminal update: the dev control plane's answer.
  json Send(const v1::DaemonUpgradePayload& payload,
            std::chrono::seconds limit = std::chrono::seconds(90)) {
    std::string payload_json;
    (void)google::protobuf::util::MessageToJsonString(payload, &payload_json);
    absl::StatusOr<std::string> answer =
        control_->Run("n-1", "daemon.upgrade", payload_json, limit);
    if (!answer.ok()) return {{"error", std::string(answer.status().message())}};
    return json::parse(*answer);
  }
  // `bcd status --json`, asked of the running daemon.
  json Status() {
    testing::Ran ran = testing::RunShell(binary().string() + " status --json --config " + config_ +
                                         " 2>/dev/null");
    return json::parse(ran.out, nullptr, false);
  }
  bool EventSeen(const std::string& kind) const {
    for (const v1::AgentFrame& frame : gateway_->Received("n-1")) {
      if (frame.has_event() && frame.event().kind() == kind) return true;
    }
    return false;
  }
  // A shell script as a release: it says it is `version` and then does `then`.
  std::filesystem::path Script(const std::string& name, const std::string& version,
                               const std::string& then) {
    std::filesystem::path path = Release(name);
    std::ofstream(path) << "#!/bin/sh\nif [ \"$1\" = --version ]; then echo \"bcd " << version
                        << "\"; exit 0; fi\n"
                        << then << "\n";
    return path;
  }
  static json ResultOf(const json& answer) {
    return answer.contains("result") && answer["result"].is_object() ? answer["result"]
                                                                     : json::object();
  }
  // After a failed trial: the command FAILED saying it rolled back, with the event, and the old
  // version back at the binary's path and in session.
  void ExpectRolledBack(const json& answer, const std::string& why) {
    EXPECT_EQ(answer.value("state", ""), "COMMAND_STATE_FAILED") << answer.dump();
    EXPECT_NE(answer.value("message", "").find("rolled back to " + std::string(Version())),
              std::string::npos)
        << answer.dump();
    EXPECT_NE(answer.value("message", "").find(why), std::string::npos) << answer.dump();
    EXPECT_EQ(ResultOf(answer).value("rolled_back", false), true) << answer.dump();
    EXPECT_EQ(ResultOf(answer).value("version", ""), Version());
    EXPECT_EQ(FileSha(binary()), old_sha_);
    EXPECT_TRUE(WaitForHello(Version()));
    EXPECT_TRUE(EventSeen("daemon.upgrade_rolled_back"));
    json status = Status();
    EXPECT_EQ(status["upgrade"]["last"]["outcome"], "rolled_back") << status.dump();
    EXPECT_TRUE(status["upgrade"]["under_way"].is_null()) << status.dump();
  }

  testing::FakeRoot dir_;
  std::unique_ptr<DevPki> pki_;
  std::unique_ptr<DevGateway> gateway_;
  std::unique_ptr<DevControlPlane> control_;
  std::unique_ptr<testing::ReleaseServer> releases_;
  pki::PrivateKey release_key_ = *pki::PrivateKey::Generate();
  std::string config_;
  std::string old_sha_;
  pid_t node_ = -1;
  pid_t proxy_ = -1;
};

TEST_F(Upgrade, ReplacesItselfAndReportsFromTheNewVersion) {
  Install(PinnedUpdate("trial_seconds = 30\n"));
  StartNode();
  // The desired version waits for the upgrade that brings it.
  absl::StatusOr<std::string> ack = control_->ApplySpec(
      "n-1", R"({"daemon": {"desiredVersion": "0.2.0"}})", std::chrono::seconds(10));
  ASSERT_TRUE(ack.ok()) << ack.status();
  EXPECT_NE(ack->find("SECTION_STATE_PENDING"), std::string::npos) << *ack;

  json answer = Send(Signed(Release(kNext), kNext));
  EXPECT_EQ(answer.value("state", ""), "COMMAND_STATE_SUCCEEDED") << answer.dump() << Log();
  EXPECT_EQ(ResultOf(answer).value("version", ""), kNext);
  EXPECT_EQ(ResultOf(answer).value("previous_version", ""), Version());
  EXPECT_FALSE(ResultOf(answer).value("rolled_back", false));
  EXPECT_TRUE(WaitForHello(kNext));
  // The same process (one PID under a supervisor), now the new binary; the old one kept.
  EXPECT_EQ(kill(node_, 0), 0);
  EXPECT_EQ(std::filesystem::read_symlink("/proc/" + std::to_string(node_) + "/exe"), binary());
  EXPECT_EQ(FileSha(binary()), FileSha(Release(kNext)));
  EXPECT_EQ(FileSha(bin() / "bcd.previous"), old_sha_);
  EXPECT_FALSE(std::filesystem::exists(bin() / ".bcd.download"));
  json status = Status();
  EXPECT_EQ(status["version"], kNext) << status.dump();
  EXPECT_EQ(status["upgrade"]["previous_binary"], (bin() / "bcd.previous").string());
  EXPECT_EQ(status["upgrade"]["highest"], kNext);
  EXPECT_EQ(status["upgrade"]["last"]["outcome"], "succeeded");
  EXPECT_EQ(status["upgrade"]["last"]["from"], Version());
  EXPECT_EQ(status["upgrade"]["last"]["to"], kNext);
  EXPECT_TRUE(status["upgrade"]["under_way"].is_null());
  // The desired version is applied now that it runs.
  ack = control_->ApplySpec("n-1", R"({"daemon": {"desiredVersion": "0.2.0"}})",
                            std::chrono::seconds(10));
  ASSERT_TRUE(ack.ok()) << ack.status();
  EXPECT_NE(ack->find("SECTION_STATE_APPLIED"), std::string::npos) << *ack;

  // A replay of the release it runs, and an older signed release, are refused before anything.
  answer = Send(Signed(Release(kNext), kNext));
  EXPECT_EQ(answer.value("state", ""), "COMMAND_STATE_FAILED") << answer.dump();
  EXPECT_NE(answer.value("message", "").find("verification"), std::string::npos) << answer.dump();
  ASSERT_EQ(Shell(std::string(BCD_SOURCE_DIR) + "/scripts/stamp-version " + binary().string() +
                  " " + Release("0.1.5").string() + " 0.1.5"),
            0);
  answer = Send(Signed(Release("0.1.5"), "0.1.5"));
  EXPECT_EQ(answer.value("state", ""), "COMMAND_STATE_FAILED") << answer.dump();
  EXPECT_NE(answer.value("message", "").find("lower"), std::string::npos) << answer.dump();
  EXPECT_EQ(FileSha(binary()), FileSha(Release(kNext)));
  // The guard saw the trial end and went.
  for (int i = 0;
       i < 50 && Shell("pgrep -f '[u]pgrade-guard --binary " + binary().string() + "'") == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_NE(Shell("pgrep -f '[u]pgrade-guard --binary " + binary().string() + "'"), 0);
}

// The release comes through the proxy the environment names (Debian's tinyproxy; the session goes
// through it too, as gRPC reads the same variable).
TEST_F(Upgrade, DownloadsThroughTheEnvironmentsProxy) {
  Install(PinnedUpdate("trial_seconds = 30\n"));
  int port = testing::FreeLoopbackPort();
  std::filesystem::path log = dir_.path() / "tinyproxy.log";
  std::ofstream(dir_.path() / "tinyproxy.conf")
      << "Port " << port << "\nListen 127.0.0.1\nTimeout 600\nAllow 127.0.0.1\nConnectPort "
      << releases_->port() << "\nConnectPort " << gateway_->port()
      << "\nMaxClients 20\nLogLevel Connect\nLogFile \"" << log.string() << "\"\n"
      << (geteuid() == 0 ? "User nobody\nGroup nogroup\n" : "");
  std::ofstream(log).close();
  std::filesystem::permissions(log, std::filesystem::perms::all);
  std::filesystem::permissions(dir_.path(), std::filesystem::perms::others_exec,
                               std::filesystem::perm_options::add);
  proxy_ =
      testing::SpawnChild({"tinyproxy", "-d", "-c", (dir_.path() / "tinyproxy.conf").string()});
  ASSERT_TRUE(testing::WaitForLoopbackPort(static_cast<uint16_t>(port)));
  setenv("https_proxy", ("http://127.0.0.1:" + std::to_string(port)).c_str(), 1);
  StartNode();
  unsetenv("https_proxy");
  json answer = Send(Signed(Release(kNext), kNext));
  EXPECT_EQ(answer.value("state", ""), "COMMAND_STATE_SUCCEEDED") << answer.dump() << Log();
  EXPECT_NE(ReadWholeFile(log, 1 << 20)->find("127.0.0.1:" + std::to_string(releases_->port())),
            std::string::npos)
      << *ReadWholeFile(log, 1 << 20);
}

TEST_F(Upgrade, RefusedWithoutPinnedKeys) {
  Install("");
  StartNode();
  json answer = Send(Signed(Release(kNext), kNext));
  EXPECT_EQ(answer.value("state", ""), "COMMAND_STATE_REJECTED") << answer.dump();
  EXPECT_EQ(answer.value("code", ""), "COMMAND_CODE_UNSUPPORTED") << answer.dump();
  EXPECT_NE(answer.value("message", "").find("replaced by hand"), std::string::npos);
  EXPECT_EQ(FileSha(binary()), old_sha_);
}

// Each refusal leaves the node as it was: the same binary, running, in session.
TEST_F(Upgrade, RefusesWhatDoesNotVerify) {
  Install(PinnedUpdate());
  StartNode();
  auto refused = [&](const v1::DaemonUpgradePayload& payload, const std::string& says) {
    json answer = Send(payload);
    EXPECT_EQ(answer.value("state", ""), "COMMAND_STATE_FAILED") << says << answer.dump();
    EXPECT_NE(answer.value("message", "").find(says), std::string::npos) << answer.dump();
    EXPECT_EQ(FileSha(binary()), old_sha_) << says;
    EXPECT_FALSE(std::filesystem::exists(bin() / ".bcd.download")) << says;
    EXPECT_FALSE(std::filesystem::exists(bin() / "bcd.previous")) << says;
    EXPECT_EQ(kill(node_, 0), 0) << says;
  };
  pki::PrivateKey stranger = *pki::PrivateKey::Generate();
  refused(DevPki::SignRelease(stranger, kNext, OsArchHere(),
                              *ReadWholeFile(Release(kNext), std::size_t{1} << 30),
                              releases_->Url("bcd-0.2.0")),
          "not one of [update] release_keys");
  refused(
      Signed(Release(kNext), kNext, OsArchHere() == "linux/amd64" ? "linux/arm64" : "linux/amd64"),
      "signature");
  v1::DaemonUpgradePayload wrong_sha = Signed(Release(kNext), kNext);
  wrong_sha.set_sha256(pki::Sha256("another binary"));
  refused(wrong_sha, "signature");
  // Signed as it should be, but the server's bytes are not those.
  v1::DaemonUpgradePayload genuine = Signed(Release(kNext), kNext);
  std::filesystem::path tampered = Release("tampered");
  std::filesystem::copy_file(Release(kNext), tampered);
  std::ofstream(tampered, std::ios::app) << "and a little more";
  genuine.set_url(releases_->Url("bcd-tampered"));
  // The URL is not signed (the bytes are): the same release from another place is fine, other
  // bytes are not.
  refused(genuine, "sha256");
  refused(Signed(Release(kNext), "0.0.9"), "lower");
  refused(Signed(Release(kNext), std::string(Version())), "running");
  v1::DaemonUpgradePayload plain = Signed(Release(kNext), kNext);
  plain.set_url("http://127.0.0.1:" + std::to_string(releases_->port()) + "/bcd-0.2.0");
  refused(plain, "https");
  // It still upgrades afterwards.
  json answer = Send(Signed(Release(kNext), kNext));
  EXPECT_EQ(answer.value("state", ""), "COMMAND_STATE_SUCCEEDED") << answer.dump() << Log();
}

TEST_F(Upgrade, RefusesADownloadOverTheCap) {
  Install(PinnedUpdate("max_bytes = 1048576\n"));
  StartNode();
  json answer = Send(Signed(Release(kNext), kNext));
  EXPECT_EQ(answer.value("state", ""), "COMMAND_STATE_FAILED") << answer.dump();
  EXPECT_NE(answer.value("message", "").find("over the cap"), std::string::npos) << answer.dump();
  EXPECT_EQ(FileSha(binary()), old_sha_);
  EXPECT_FALSE(std::filesystem::exists(bin() / ".bcd.download"));
}

TEST_F(Upgrade, RefusesWhenTheDiskIsTooSmall) {
  Install(PinnedUpdate("keep_free_bytes = 1099511627776\n"));  // 1 TiB must stay free
  StartNode();
  json answer = Send(Signed(Release(kNext), kNext));
  EXPECT_EQ(answer.value("state", ""), "COMMAND_STATE_FAILED") << answer.dump();
  EXPECT_NE(answer.value("message", "").find("must stay free"), std::string::npos) << answer.dump();
  EXPECT_EQ(FileSha(binary()), old_sha_);
  EXPECT_FALSE(std::filesystem::exists(bin() / ".bcd.download"));
}

TEST_F(Upgrade, RefusesAReleaseThatDoesNotRunHere) {
  Install(PinnedUpdate());
  StartNode();
  // Signed as 0.3.0, but it says it is 0.2.0.
  json answer = Send(Signed(Release(kNext), "0.3.0"));
  EXPECT_EQ(answer.value("state", ""), "COMMAND_STATE_FAILED") << answer.dump();
  EXPECT_NE(answer.value("message", "").find("does not run here"), std::string::npos)
      << answer.dump();
  EXPECT_EQ(FileSha(binary()), old_sha_);
}

TEST_F(Upgrade, RollsBackAReleaseThatExitsAtOnce) {
  Install(PinnedUpdate());
  StartNode();
  json answer = Send(Signed(Script("exits", "0.3.0", "exit 0"), "0.3.0"));
  ExpectRolledBack(answer, "exited during its trial");
}

TEST_F(Upgrade, RollsBackAReleaseThatHangs) {
  Install(PinnedUpdate());
  StartNode();
  json answer = Send(Signed(Script("hangs", "0.3.0", "exec sleep 600"), "0.3.0"));
  ExpectRolledBack(answer, "not welcomed by the gateway in time");
}

// A real new version that cannot reach the gateway (started with a config whose gateway does not
// answer): its own trial ends it, and the old version comes back with the command line it had.
TEST_F(Upgrade, RollsBackAReleaseThatCannotDial) {
  Install(PinnedUpdate());
  std::string broken = (dir_.path() / "broken.toml").string();
  int closed = testing::FreeLoopbackPort();
  std::string text = *ReadWholeFile(config_, 1 << 20);
  std::string from = "127.0.0.1:" + std::to_string(gateway_->port());
  text.replace(text.find(from), from.size(), "127.0.0.1:" + std::to_string(closed));
  std::ofstream(broken) << text;
  std::filesystem::path real = bin() / "bcd-real-0.3.0";  // in bin/: the teardown stops it
  ASSERT_EQ(Shell(std::string(BCD_SOURCE_DIR) + "/scripts/stamp-version " + binary().string() +
                  " " + real.string() + " 0.3.0"),
            0);
  StartNode();
  json answer = Send(
      Signed(Script("cannot-dial", "0.3.0", "exec " + real.string() + " node --config " + broken),
             "0.3.0"));
  ExpectRolledBack(answer, "not welcomed by the gateway within 5 s");
}

}  // namespace
}  // namespace bcd
