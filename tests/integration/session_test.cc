// The session engine against the dev gateway: Hello fields, negotiation, unknown frames,
// reconnects, pushback and refusals, over real gRPC and TLS 1.3 on loopback; and the real bcd
// binary under SIGTERM.

#include <signal.h>
#include <sys/stat.h>

#include <sstream>
#include <thread>

#include "app/cli.h"
#include "base/version.h"
#include "daemon/agent.h"
#include "daemon/identity/identity.h"
#include "daemon/identity/join.h"
#include "fmt/format.h"
#include "gtest/gtest.h"
#include "modes/node/node_mode.h"
#include "modes/ramdisk/ramdisk_mode.h"
#include "modes/site/site_mode.h"
#include "pki/envelope.h"
#include "pki/keys.h"
#include "proto/absl_compat.h"
#include "proto/frame_codec.h"
#include "proto/signing_input.h"
#include "testing/child_process.h"
#include "testing/dev_gateway.h"
#include "tests/unit/fake_root.h"

namespace bcd {
namespace {

namespace v1 = bettercompute::agent::v1;
using bcd::testing::DevGateway;
using bcd::testing::DevPki;
using bcd::testing::FakeRoot;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr auto kWait = seconds(20);

class Session : public ::testing::Test {
 protected:
  Session() : pki_(*DevPki::Create(std::time(nullptr))) { StartGateway("1..1"); }
  ~Session() override {
    StopDaemon();
    gateway_.reset();
  }

  void StartGateway(const std::string& protocol, int port = 0) {
    gateway_.reset();
    gateway_ = *DevGateway::Start(
        pki_, {.listen = "127.0.0.1:" + std::to_string(port), .protocol = protocol});
  }

  std::string ConfigText(const std::string& state) {
    return gateway_->ConfigToml(dir_.path() / state);
  }

  Config JoinAs(const std::string& node, const std::string& state = "state") {
    Config config = *Config::Parse(ConfigText(state), "test.toml");
    JoinSpec spec{.evidence = gateway_->AddJoinToken(node),
                  .now = [] { return static_cast<int64_t>(std::time(nullptr)); },
                  .sleep = [](seconds) {}};
    EXPECT_TRUE(JoinFleet(config, spec).ok());
    return config;
  }

  void StartDaemon(const Config& config, std::unique_ptr<Mode> mode = nullptr) {
    if (!mode) {
      auto node = std::make_unique<NodeMode>();
      node_mode_ = node.get();
      mode = std::move(node);
    }
    daemon_ = *Agent::Create(config, std::move(mode),
                             {.now = [] { return static_cast<int64_t>(std::time(nullptr)); },
                              .uniform01 = [] { return 0.01; },
                              .log = &log_,
                              .welcome_timeout = welcome_timeout_});
    runner_ = std::thread([this] { result_ = daemon_->Run(); });
  }

  void StopDaemon() {
    if (!daemon_) return;
    daemon_->Stop();
    runner_.join();
    daemon_.reset();
  }

  FakeRoot dir_;
  DevPki pki_;
  std::unique_ptr<DevGateway> gateway_;
  std::ostringstream log_text_;
  Logger log_{&log_text_, LogLevel::kInfo};
  std::unique_ptr<Agent> daemon_;
  NodeMode* node_mode_ = nullptr;  // the daemon's, when it runs node mode
  std::thread runner_;
  absl::Status result_;
  milliseconds welcome_timeout_ = seconds(30);
};

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_F(Session, HelloCarriesEveryFieldAndAStatusReportFollows) {
  StartDaemon(JoinAs("n-1"));
  ASSERT_TRUE(gateway_->WaitForReceived("n-1", 1, kWait));
  v1::Hello hello = *gateway_->LastHello("n-1");
  EXPECT_EQ(hello.proto_min(), 1u);
  EXPECT_EQ(hello.proto_max(), 1u);
  EXPECT_EQ(hello.daemon_version(), Version());
  EXPECT_EQ(hello.role(), bettercompute::common::v1::ROLE_NODE);
  EXPECT_EQ(hello.trust_version(), 1u);
  EXPECT_EQ(hello.applied_generation(), 0u);
  EXPECT_EQ(hello.last_acked_seq(), 0u);
  EXPECT_EQ(hello.boot_id().size(), 36u);
  EXPECT_GT(hello.started_at(), 0u);
  EXPECT_EQ(hello.approver_set_epoch(), 0u);
  EXPECT_EQ(hello.approver_set_sha256(), pki::Sha256(proto::ApproverSetInput(v1::TrustBundle())));
  ASSERT_TRUE(gateway_->WaitForReceived("n-1", 1, kWait));
  v1::AgentFrame status = gateway_->Received("n-1").front();
  ASSERT_TRUE(status.has_status());
  EXPECT_EQ(status.status().trust_version(), 1u);
  EXPECT_GT(status.status().certificate_not_after(), static_cast<uint64_t>(std::time(nullptr)));
  EXPECT_EQ(daemon_->Snapshot().state, "connected");
  EXPECT_EQ(daemon_->Snapshot().session_id, "dev-session-1");
}

// Each mode's Hello carries its role and the engine's capabilities with the mode's own; the same
// engine runs all three.
TEST_F(Session, EachModeSendsItsRoleAndCapabilities) {
  struct Case {
    std::function<std::unique_ptr<Mode>()> make;
    bettercompute::common::v1::Role role;
    std::vector<std::string> capabilities;
  };
  std::vector<std::string> engine = {"tunnel.shell", "tunnel.exec", "tunnel.tcp",
                                     "secrets.jwe",  "spec.daemon", "spec.access"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> all = engine;
    all.insert(all.end(), extra.begin(), extra.end());
    return all;
  };
  std::vector<Case> cases = {
      {[] { return std::make_unique<NodeMode>(); }, bettercompute::common::v1::ROLE_NODE,
       with({"tunnel.instance-dial", "workload-token"})},
      {[] { return std::make_unique<SiteMode>(); }, bettercompute::common::v1::ROLE_SITE, engine},
      {[] { return std::make_unique<RamdiskMode>(); }, bettercompute::common::v1::ROLE_RAMDISK,
       engine},
  };
  Config config = JoinAs("n-1");
  int welcomes = 0;
  for (const Case& c : cases) {
    StartDaemon(config, c.make());
    ASSERT_TRUE(gateway_->WaitForWelcomes(++welcomes, kWait));
    v1::Hello hello = *gateway_->LastHello("n-1");
    EXPECT_EQ(hello.role(), c.role);
    EXPECT_EQ(std::vector<std::string>(hello.capabilities().begin(), hello.capabilities().end()),
              c.capabilities)
        << bettercompute::common::v1::Role_Name(c.role);
    StopDaemon();
  }
}

TEST_F(Session, StopClosesTheStreamCleanly) {
  StartDaemon(JoinAs("n-1"));
  ASSERT_TRUE(gateway_->WaitForWelcomes(1, kWait));
  StopDaemon();
  EXPECT_TRUE(result_.ok()) << result_;
  ASSERT_TRUE(gateway_->WaitForNoSession("n-1", kWait));
  EXPECT_EQ(gateway_->clean_ends(), 1);
}

TEST_F(Session, NegotiatesTheHighestSharedVersion) {
  Config config = JoinAs("n-1");
  StartGateway("1..3", gateway_->port());
  StartDaemon(config);
  ASSERT_TRUE(gateway_->WaitForReceived("n-1", 1, kWait));  // sent after the Welcome is recorded
  EXPECT_EQ(daemon_->Snapshot().protocol_version, 1u);
  EXPECT_FALSE(daemon_->Snapshot().upgrade_required);
}

TEST_F(Session, AGatewayAboveTheDaemonSaysUpgradeRequired) {
  Config config = JoinAs("n-1");
  StartGateway("2..3", gateway_->port());
  StartDaemon(config);
  ASSERT_TRUE(gateway_->WaitForWelcomes(1, kWait));
  ASSERT_TRUE(gateway_->WaitForReceived("n-1", 1, kWait));  // the StatusReport after Welcome
  EXPECT_EQ(daemon_->Snapshot().protocol_version, 2u);
  EXPECT_TRUE(daemon_->Snapshot().upgrade_required);
  EXPECT_EQ(daemon_->Snapshot().state, "connected");
}

TEST_F(Session, IgnoresUnknownServerFramesAndTakesANewerTrustBundle) {
  StartDaemon(JoinAs("n-1"));
  ASSERT_TRUE(gateway_->WaitForWelcomes(1, kWait));
  v1::ServerFrame future;
  ASSERT_TRUE(proto::DecodeMessage(std::string("\x92\x03\x05\x0a\x03new", 8), &future).ok());
  ASSERT_TRUE(gateway_->Push("n-1", future));
  v1::ServerFrame trust;
  *trust.mutable_trust() = pki_.SignedBundle(2);
  ASSERT_TRUE(gateway_->Push("n-1", trust));
  // The change sends an event (through the outbox) and a StatusReport.
  ASSERT_TRUE(gateway_->WaitForReceived("n-1", 3, kWait));
  EXPECT_EQ(gateway_->Received("n-1")[1].event().kind(), "trust.updated");
  EXPECT_EQ(gateway_->Received("n-1")[1].event().attributes().at("version"), "2");
  EXPECT_EQ(gateway_->Received("n-1")[2].status().trust_version(), 2u);
  EXPECT_EQ(daemon_->Snapshot().trust_version, 2u);
  EXPECT_EQ(daemon_->Snapshot().unknown_frames, 1);
  EXPECT_EQ(daemon_->Snapshot().welcomes, 1) << "the unknown frame did not end the session";
  EXPECT_NE(log_text_.str().find("event=trust.updated version=2"), std::string::npos);
  Identity stored = *StateDir::Open(dir_.path() / "state")->LoadIdentity();
  v1::TrustBundle persisted;
  ASSERT_TRUE(persisted.ParseFromString(stored.trust_bundle.body()));
  EXPECT_EQ(persisted.version(), 2u) << "the newer bundle is persisted";
}

TEST_F(Session, ReconnectsAfterTheGatewayRestarts) {
  StartDaemon(JoinAs("n-1"));
  ASSERT_TRUE(gateway_->WaitForWelcomes(1, kWait));
  int port = gateway_->port();
  StartGateway("1..1", port);  // the old one is gone, sessions dropped
  ASSERT_TRUE(gateway_->WaitForReceived("n-1", 1, kWait));
  EXPECT_EQ(daemon_->Snapshot().welcomes, 2);
}

TEST_F(Session, HonoursPushbackWithinItsBoundsAndWithJitter) {
  Config config = JoinAs("n-1");
  gateway_->RefuseSessions(1, grpc::StatusCode::UNAVAILABLE, "overloaded", 400);
  StartDaemon(config);
  ASSERT_TRUE(gateway_->WaitForWelcomes(1, kWait));
  // 400 ms is below the 1 s floor; jitter (fixed at 0.01 here) adds up to a quarter.
  EXPECT_NE(log_.Text().find("event=session.ended reason=overloaded error=\"refused (overloaded): "
                             "refused by the dev gateway\" retry_ms=1002\n"),
            std::string::npos)
      << log_.Text();
}

TEST_F(Session, ARedialStormIsLoggedOnceNotPerRedial) {
  Config config = JoinAs("n-1");
  gateway_->RefuseSessions(8, grpc::StatusCode::UNAVAILABLE, "overloaded", 0);
  StartDaemon(config);
  ASSERT_TRUE(gateway_->WaitForWelcomes(1, kWait));
  std::string text = log_.Text();
  EXPECT_EQ(Count(text, "level=warn event=session.ended"), 5) << text;
  EXPECT_EQ(Count(text, "level=warn event=session.redialing failures=5"), 1) << text;
}

TEST_F(Session, AFrameThatDoesNotDecodeEndsTheSessionWhichIsRedialed) {
  StartDaemon(JoinAs("n-1"));
  ASSERT_TRUE(gateway_->WaitForReceived("n-1", 1, kWait));
  ASSERT_TRUE(gateway_->PushUndecodable("n-1"));
  ASSERT_TRUE(gateway_->WaitForWelcomes(2, kWait)) << "the session was never redialed";
  EXPECT_NE(log_.Text().find("event=session.ended reason=protocol-error error=\"refused "
                             "(protocol-error): a ServerFrame from the gateway did not decode: "
                             "INVALID_FRAME"),
            std::string::npos)
      << log_.Text();
  // The new session serves: a command is answered.
  ASSERT_TRUE(gateway_->WaitForReceived("n-1", 1, kWait));
  v1::ServerFrame frame;
  *frame.mutable_command() = pki_.SignCommand(
      DevPki::MakeCommand("c-after", "n-1", "inventory.refresh", std::time(nullptr)));
  ASSERT_TRUE(gateway_->Push("n-1", frame));
  EXPECT_TRUE(gateway_->WaitForReceived("n-1", 3, kWait));
}

TEST_F(Session, NoWelcomeInTimeEndsTheSessionAndStatusShowsNoStaleSession) {
  welcome_timeout_ = seconds(1);
  StartDaemon(JoinAs("n-1"));
  ASSERT_TRUE(gateway_->WaitForWelcomes(1, kWait));
  ASSERT_TRUE(
      daemon_->WaitUntil([](const SessionSnapshot& s) { return s.state == "connected"; }, kWait));
  std::string first = daemon_->Snapshot().session_id;
  ASSERT_FALSE(first.empty());
  // The next session gets no Welcome.
  gateway_->WithholdWelcomes(1);
  gateway_->DropSessions();
  ASSERT_TRUE(daemon_->WaitUntil(
      [](const SessionSnapshot& s) { return s.state == "connecting" && s.welcomes == 1; }, kWait));
  EXPECT_EQ(daemon_->Snapshot().session_id, "");
  EXPECT_EQ(daemon_->StatusText().find(first), std::string::npos) << "the last session's id";
  ASSERT_TRUE(gateway_->WaitForWelcomes(2, kWait)) << "the silent session was never given up";
  EXPECT_NE(log_.Text().find("event=session.ended reason=protocol-error error=\"refused "
                             "(protocol-error): no Welcome within 1 s of the session's start\""),
            std::string::npos)
      << log_.Text();
}

TEST_F(Session, RevokedStopsTheDaemonWithoutRedialling) {
  Config config = JoinAs("n-1");
  gateway_->RefuseSessions(5, grpc::StatusCode::PERMISSION_DENIED, "revoked", 0);
  StartDaemon(config);
  runner_.join();
  EXPECT_EQ(result_.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(result_.message()),
            "the gateway refused (revoked): refused by the dev gateway; a person must act");
  EXPECT_EQ(daemon_->Snapshot().state, "stopped");
  daemon_.reset();
  EXPECT_TRUE(gateway_->SessionNodes().empty());
}

TEST_F(Session, TheNodeIdComesFromTheCertificate) {
  Config one = JoinAs("n-1", "state-1");
  Config two = JoinAs("n-2", "state-2");
  StartDaemon(two);
  ASSERT_TRUE(gateway_->WaitForWelcomes(1, kWait));
  EXPECT_EQ(gateway_->SessionNodes(), std::vector<std::string>{"n-2"});
  EXPECT_FALSE(gateway_->LastHello("n-1").has_value());
}

TEST_F(Session, RefusesToStartWithoutAnIdentity) {
  Config config = *Config::Parse(ConfigText("empty"), "test.toml");
  absl::StatusOr<std::unique_ptr<Agent>> daemon = Agent::Create(
      config, std::make_unique<NodeMode>(), {.now = [] { return int64_t{0}; }, .log = &log_});
  EXPECT_EQ(daemon.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(Session, AnExpiredCertificateSaysHowToRejoin) {
  Config config = JoinAs("n-1");
  absl::StatusOr<std::unique_ptr<Agent>> daemon =
      Agent::Create(config, std::make_unique<NodeMode>(),
                    {.now = [] { return int64_t{4000000000}; }, .log = &log_});
  EXPECT_EQ(daemon.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(std::string(daemon.status().message()).find("Re-join"), std::string::npos);
}

TEST_F(Session, TheBcdBinaryRunsUntilSigtermAndEndsCleanly) {
  JoinAs("n-1");
  dir_.Write("config.toml", ConfigText("state"));
  pid_t pid = bcd::testing::SpawnChild(
      {BCD_BINARY, "node", "--config", (dir_.path() / "config.toml").string()});
  ASSERT_GT(pid, 0);
  ASSERT_TRUE(gateway_->WaitForWelcomes(1, kWait));
  kill(pid, SIGTERM);
  EXPECT_EQ(bcd::testing::WaitChild(pid), 0);
  ASSERT_TRUE(gateway_->WaitForNoSession("n-1", kWait));
  EXPECT_EQ(gateway_->clean_ends(), 1);
}

}  // namespace
}  // namespace bcd

namespace bcd {
namespace {

class Renewal : public Session {
 protected:
  Renewal() { gateway_ = *DevGateway::Start(pki_, {.node_cert_lifetime = 6}); }
};

TEST_F(Renewal, AShortCertificateIsRenewedTwiceWithoutLosingTheSession) {
  Config config = JoinAs("n-1");
  Identity joined = *StateDir::Open(dir_.path() / "state")->LoadIdentity();
  StartDaemon(config);
  ASSERT_TRUE(gateway_->WaitForReceived("n-1", 1, kWait));
  // 6 s certificates renew at 2/3 of their life: twice within about 10 s.
  ASSERT_TRUE(daemon_->WaitForRenewals(2, seconds(30))) << log_text_.str();
  EXPECT_EQ(gateway_->renewals(), 2);
  Identity renewed = *StateDir::Open(dir_.path() / "state")->LoadIdentity();
  EXPECT_EQ(renewed.node.id, joined.node.id);
  EXPECT_EQ(renewed.node.generation, 3u);
  EXPECT_NE(renewed.key.Public().SpkiDer(), joined.key.Public().SpkiDer());
  EXPECT_EQ(daemon_->Snapshot().welcomes, 1) << "the session went on across both renewals";
  EXPECT_EQ(gateway_->SessionNodes().size(), 1u);
}

TEST_F(Renewal, TheNextDialUsesTheRenewedIdentity) {
  Config config = JoinAs("n-1");
  StartDaemon(config);
  ASSERT_TRUE(gateway_->WaitForReceived("n-1", 1, kWait));
  ASSERT_TRUE(daemon_->WaitForRenewals(1, seconds(30)));
  gateway_->DropSessions();
  ASSERT_TRUE(gateway_->WaitForWelcomes(2, kWait));
  EXPECT_EQ(gateway_->SessionNodes(), (std::vector<std::string>{"n-1", "n-1"}));
}

}  // namespace
}  // namespace bcd

namespace bcd {
namespace {

std::string StatusOutput(const std::filesystem::path& config) {
  std::ostringstream out, err;
  CliEnv env{.out = out,
             .err = err,
             .now = [] { return static_cast<uint64_t>(std::time(nullptr)); },
             .default_config = config};
  EXPECT_EQ(RunCli({"status"}, env), kExitOk) << err.str();
  return out.str();
}

TEST_F(Session, StatusComesFromTheRunningDaemon) {
  JoinAs("n-1");
  dir_.Write("config.toml", ConfigText("state"));
  StartDaemon(*Config::Load(dir_.path() / "config.toml"));
  ASSERT_TRUE(gateway_->WaitForReceived("n-1", 1, kWait));
  std::string text = StatusOutput(dir_.path() / "config.toml");
  EXPECT_NE(text.find("node: spiffe://dev.test/site/dev/node/n-1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("trust version: 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("session: connected over grpc (session dev-session-1, protocol 1)\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("last error: -\n"), std::string::npos) << text;
  struct stat st {};
  ASSERT_EQ(stat((dir_.path() / "state" / "bcd.sock").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(Session, StatusFallsBackToTheStateDir) {
  JoinAs("n-1");
  dir_.Write("config.toml", ConfigText("state"));
  std::string text = StatusOutput(dir_.path() / "config.toml");
  EXPECT_NE(text.find("node: spiffe://dev.test/site/dev/node/n-1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("session: not running (no daemon answers on " +
                      (dir_.path() / "state" / "bcd.sock").string()),
            std::string::npos)
      << text;
}

TEST_F(Session, ASecondDaemonOnTheSameStateDirIsRefusedBeforeItOpensAnything) {
  JoinAs("n-1");
  // The first daemon serves the metadata service on a port of its own; a second one that opened
  // its servers before its check would try that port too, and say so in its log.
  uint16_t port = static_cast<uint16_t>(bcd::testing::FreeLoopbackPort());
  dir_.Write("config.toml",
             ConfigText("state") + fmt::format("[imds]\nlisten = \"127.0.0.1:{}\"\n", port));
  Config config = *Config::Load(dir_.path() / "config.toml");
  StartDaemon(config);
  ASSERT_TRUE(gateway_->WaitForReceived("n-1", 1, kWait));
  ASSERT_EQ(node_mode_->imds_port(), port);
  std::ostringstream second_log;
  Logger log(&second_log, LogLevel::kDebug);
  absl::StatusOr<std::unique_ptr<Agent>> second =
      Agent::Create(config, std::make_unique<NodeMode>(),
                    {.now = [] { return static_cast<int64_t>(std::time(nullptr)); }, .log = &log});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(ToStd(second.status().message())),
            "another bcd is already running on " + (dir_.path() / "state").string());
  EXPECT_EQ(second_log.str(), "") << "it opened something before it was refused";
}

TEST_F(Session, StatusSaysPermissionDeniedToAUserWhoCannotReadTheStateDir) {
  JoinAs("n-1");
  // The config is readable by anyone; the state dir (0700) is not.
  dir_.Write("public/config.toml", ConfigText("state"));
  chmod(dir_.path().c_str(), 0755);
  chmod((dir_.path() / "public").c_str(), 0755);
  chmod((dir_.path() / "public/config.toml").c_str(), 0644);
  std::string as_user;
  if (geteuid() == 0) {
    as_user = "setpriv --reuid=65534 --regid=65534 --clear-groups ";
  } else {
    chmod((dir_.path() / "state").c_str(), 0);  // its owner cannot read it either
  }
  bcd::testing::Ran ran = bcd::testing::RunShell(as_user + BCD_BINARY " status --config " +
                                                 (dir_.path() / "public/config.toml").string());
  chmod((dir_.path() / "state").c_str(), 0700);
  EXPECT_EQ(ran.status, 1) << ran.out;
  EXPECT_EQ(ran.out, "bcd status: cannot read the state dir " + (dir_.path() / "state").string() +
                         ": permission denied (run bcd status as root, or as the user bcd runs "
                         "as)\n");
}

}  // namespace
}  // namespace bcd

#include "testing/fault_proxy.h"

namespace bcd {
namespace {

TEST_F(Session, KeepaliveNoticesAStalledNetworkAndTheDaemonRedials) {
  auto proxy = *bcd::testing::FaultProxy::Start(gateway_->port());
  Config direct = JoinAs("n-1");
  std::string text = ConfigText("state");
  std::string from = "127.0.0.1:" + std::to_string(gateway_->port());
  text.replace(text.find(from), from.size(), "127.0.0.1:" + std::to_string(proxy->port()));
  Config config = *Config::Parse(text, "proxy.toml");
  daemon_ = *Agent::Create(config, std::make_unique<NodeMode>(),
                           {.now = [] { return static_cast<int64_t>(std::time(nullptr)); },
                            .uniform01 = [] { return 0.01; },
                            .log = &log_,
                            .keepalive_time = milliseconds(300),
                            .keepalive_timeout = milliseconds(300)});
  runner_ = std::thread([this] { result_ = daemon_->Run(); });
  ASSERT_TRUE(daemon_->WaitUntil([](const SessionSnapshot& s) { return s.welcomes == 1; }, kWait));
  proxy->Stall();  // packets vanish; no RST, no FIN
  ASSERT_TRUE(
      daemon_->WaitUntil([](const SessionSnapshot& s) { return s.state != "connected"; }, kWait))
      << "keepalive did not notice the stall";
  proxy->Resume();
  ASSERT_TRUE(daemon_->WaitUntil([](const SessionSnapshot& s) { return s.welcomes == 2; }, kWait));
  EXPECT_GE(proxy->connections(), 2);
}

}  // namespace
}  // namespace bcd

namespace bcd {
namespace {

// Events in the order and number the gateway saw them (seq and kind).
std::vector<std::pair<uint64_t, std::string>> EventsSeen(const DevGateway& gateway) {
  std::vector<std::pair<uint64_t, std::string>> out;
  for (const auto& frame : gateway.Received("n-1")) {
    if (frame.has_event()) out.emplace_back(frame.event().seq(), frame.event().kind());
  }
  return out;
}

TEST_F(Session, AnEventNotAckedBeforeAGatewayRestartIsSentAgainAndThenNeverTwice) {
  Config config = JoinAs("n-1");
  gateway_->WithholdAcks(true);
  StartDaemon(config);
  ASSERT_TRUE(gateway_->WaitForReceived("n-1", 1, kWait));
  v1::ServerFrame trust;
  *trust.mutable_trust() = pki_.SignedBundle(2);
  ASSERT_TRUE(gateway_->Push("n-1", trust));
  ASSERT_TRUE(gateway_->WaitForReceived("n-1", 3, kWait));
  EXPECT_EQ(EventsSeen(*gateway_),
            (std::vector<std::pair<uint64_t, std::string>>{{1, "trust.updated"}}));
  EXPECT_EQ(daemon_->Snapshot().outbox_pending, 1u);

  int port = gateway_->port();
  StartGateway("1..1", port);  // acks as usual; the unacknowledged event must come again
  ASSERT_TRUE(
      daemon_->WaitUntil([](const SessionSnapshot& s) { return s.last_acked_seq == 1; }, kWait));
  EXPECT_EQ(gateway_->LastHello("n-1")->last_acked_seq(), 0u);
  EXPECT_EQ(EventsSeen(*gateway_),
            (std::vector<std::pair<uint64_t, std::string>>{{1, "trust.updated"}}));
  EXPECT_EQ(daemon_->Snapshot().outbox_pending, 0u);

  StopDaemon();  // a restarted daemon knows what was acknowledged and sends nothing again
  StartGateway("1..1", port);
  StartDaemon(config);
  ASSERT_TRUE(gateway_->WaitForReceived("n-1", 1, kWait));
  EXPECT_EQ(gateway_->LastHello("n-1")->last_acked_seq(), 1u);
  EXPECT_TRUE(EventsSeen(*gateway_).empty());
}

}  // namespace
}  // namespace bcd

namespace bcd {
namespace {

TEST_F(Session, ABundleWhoseApproverSetWasRefusedIsKeptWithTheHeldSetAcrossARestart) {
  Config config = JoinAs("n-1");
  StartDaemon(config);
  ASSERT_TRUE(gateway_->WaitForReceived("n-1", 1, kWait));
  std::vector<pki::PrivateKey> first = {*pki::PrivateKey::Generate()};
  std::vector<pki::PrivateKey> takeover = {*pki::PrivateKey::Generate(),
                                           *pki::PrivateKey::Generate()};
  v1::ServerFrame frame;
  v1::SignedTrustBundle held = pki_.SignedBundleWithApprovers(2, first, 1, 1);  // the first set
  *frame.mutable_trust() = held;
  ASSERT_TRUE(gateway_->Push("n-1", frame));
  *frame.mutable_trust() =
      pki_.SignedBundleWithApprovers(3, takeover, 1, 2);  // not signed by the held set
  ASSERT_TRUE(gateway_->Push("n-1", frame));
  ASSERT_TRUE(
      daemon_->WaitUntil([](const SessionSnapshot& s) { return s.trust_version == 3; }, kWait));
  ASSERT_TRUE(gateway_->WaitForReceived("n-1", 5,
                                        kWait));  // two events, two status reports after the first
  EXPECT_NE(log_text_.str().find("event=trust.approver_set_refused"), std::string::npos);
  pki::TrustState enforced =
      *pki::TrustState::FromFirstBundle(held, pki_.join_service_key().Public());
  std::string held_sha = pki::Hex(enforced.approvers().Sha256());
  std::string status = daemon_->StatusText();
  EXPECT_NE(status.find("trust version: 3\napprover set: epoch 1, sha256 " + held_sha + "\n"),
            std::string::npos)
      << status;
  // A restart enforces what ran before: version 3, the held set at epoch 1.
  StopDaemon();
  StartDaemon(config);
  ASSERT_TRUE(gateway_->WaitForWelcomes(2, kWait));
  v1::Hello hello = *gateway_->LastHello("n-1");
  EXPECT_EQ(hello.trust_version(), 3u);
  EXPECT_EQ(hello.approver_set_epoch(), 1u);
  EXPECT_EQ(hello.approver_set_sha256(), enforced.approvers().Sha256());
  Identity stored = *StateDir::Open(dir_.path() / "state")->LoadIdentity();
  pki::TrustState restored = *TrustOf(stored);
  EXPECT_EQ(restored.version(), 3u);
  EXPECT_EQ(restored.approvers().approvers().size(), 1u);
}

}  // namespace
}  // namespace bcd
