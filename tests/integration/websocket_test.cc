// The WebSocket transport against the dev gateway's WebSocket listener: sessions, signed commands
// and a renewal over POST /v1/renew, directly, through Debian's tinyproxy (without and with basic
// auth) and through a TLS-inspecting proxy (Node's tls, tests/integration/inspecting_proxy.mjs);
// and each refusal: unproven gateways, unsigned intent, text, oversized and masked messages, a
// gateway that stops answering pings, no signing roots, tunnels.

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "daemon/agent.h"
#include "daemon/identity/gateway.h"
#include "daemon/identity/identity.h"
#include "daemon/identity/join.h"
#include "daemon/identity/renew.h"
#include "gtest/gtest.h"
#include "modes/node/node_mode.h"
#include "pki/x509.h"
#include "testing/child_process.h"
#include "testing/dev_gateway.h"
#include "testing/wait.h"
#include "tests/unit/fake_root.h"

namespace bcd {
namespace {

namespace v1 = bettercompute::agent::v1;
using bcd::testing::DevGateway;
using bcd::testing::DevPki;
using bcd::testing::FakeRoot;
using Fault = DevGateway::WsFault;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr auto kWait = seconds(20);

int64_t Now() { return static_cast<int64_t>(std::time(nullptr)); }

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A child process stopped and reaped when the test ends.
struct Child {
  pid_t pid = -1;
  ~Child() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      testing::WaitChild(pid);
    }
  }
};

class WebSocket : public ::testing::Test {
 protected:
  WebSocket() : pki_(*DevPki::Create(Now())) {
    gateway_ = *DevGateway::Start(pki_, {.node_cert_lifetime = lifetime_});
  }
  ~WebSocket() override {
    StopDaemon();
    gateway_.reset();
  }

  // Joins over gRPC (join needs no client certificate) and moves to the WebSocket.
  Config JoinAs(const std::string& node, const std::string& state = "state",
                const std::string& extra = "") {
    std::string text =
        gateway_->ConfigToml(dir_.path() / state) + gateway_->WebSocketConfigToml() + extra;
    Config config = *Config::Parse(text, "test.toml");
    JoinSpec spec{.evidence = gateway_->AddJoinToken(node), .now = Now, .sleep = [](seconds) {}};
    EXPECT_TRUE(JoinFleet(config, spec).ok());
    return config;
  }

  absl::StatusOr<std::unique_ptr<Agent>> Create(const Config& config) {
    return Agent::Create(config,
                         std::make_unique<NodeMode>(NodeModeOptions{
                             .sources = {.inventory = {root_.path(), "x86_64", nullptr, 0}}}),
                         {.now = Now,
                          .uniform01 = [] { return 0.01; },
                          .log = &log_,
                          .keepalive_time = keepalive_,
                          .keepalive_timeout = keepalive_,
                          .proxy_env = [this](const char* name) -> std::optional<std::string> {
                            auto it = env_.find(name);
                            if (it == env_.end()) return std::nullopt;
                            return it->second;
                          }});
  }

  void StartDaemon(const Config& config) {
    absl::StatusOr<std::unique_ptr<Agent>> daemon = Create(config);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = *std::move(daemon);
    runner_ = std::thread([this] { result_ = daemon_->Run(); });
  }

  void StopDaemon() {
    if (!daemon_) return;
    daemon_->Stop();
    runner_.join();
    daemon_.reset();
  }

  v1::Command Make(const std::string& id, const std::string& kind) {
    return DevPki::MakeCommand(id, "n-1", kind, std::time(nullptr));
  }

  bool Push(const v1::SignedCommand& command, bool filtered = true) {
    v1::ServerFrame frame;
    *frame.mutable_command() = command;
    return filtered ? gateway_->Push("n-1", frame) : gateway_->PushUnfiltered("n-1", frame);
  }

  // The terminal update of `id`, waiting for it.
  std::optional<v1::CommandUpdate> Terminal(const std::string& id) {
    auto deadline = std::chrono::steady_clock::now() + kWait;
    while (std::chrono::steady_clock::now() < deadline) {
      for (const auto& frame : gateway_->Received("n-1")) {
        if (!frame.has_command_update() || frame.command_update().command_id() != id) continue;
        v1::CommandState s = frame.command_update().state();
        if (s != v1::COMMAND_STATE_ACCEPTED && s != v1::COMMAND_STATE_RUNNING) {
          return frame.command_update();
        }
      }
      gateway_->WaitForReceived("n-1", gateway_->Received("n-1").size() + 1, milliseconds(200));
    }
    return std::nullopt;
  }

  // A signed inventory.refresh over the session succeeds.
  void ExpectInventoryRefresh(const std::string& id) {
    ASSERT_TRUE(Push(pki_.SignCommand(Make(id, "inventory.refresh"))));
    std::optional<v1::CommandUpdate> update = Terminal(id);
    ASSERT_TRUE(update.has_value()) << id;
    EXPECT_EQ(update->state(), v1::COMMAND_STATE_SUCCEEDED) << update->message();
  }

  bool WaitForError(const std::string& text) {
    return daemon_->WaitUntil(
        [&](const SessionSnapshot& s) { return s.last_error.find(text) != std::string::npos; },
        kWait);
  }

  // Debian's tinyproxy on a free loopback port, allowed to CONNECT to the WebSocket listener.
  int StartTinyproxy(Child* child, const std::string& basic_auth = "") {
    int port = testing::FreeLoopbackPort();
    std::filesystem::path conf = dir_.path() / "tinyproxy.conf";
    std::ofstream out(conf);
    out << "Port " << port << "\nListen 127.0.0.1\nTimeout 600\nAllow 127.0.0.1\n"
        << "ConnectPort " << gateway_->websocket_port() << "\nMaxClients 20\n"
        << "LogLevel Connect\nLogFile \"" << (dir_.path() / "tinyproxy.log").string() << "\"\n";
    if (geteuid() == 0) out << "User nobody\nGroup nogroup\n";
    if (!basic_auth.empty()) out << "BasicAuth " << basic_auth << "\n";
    out.close();
    // The log file must be reachable and writable by the proxy's user.
    std::ofstream(dir_.path() / "tinyproxy.log").close();
    std::filesystem::permissions(dir_.path() / "tinyproxy.log", std::filesystem::perms::all);
    std::filesystem::permissions(dir_.path(), std::filesystem::perms::others_exec,
                                 std::filesystem::perm_options::add);
    child->pid = testing::SpawnChild({"tinyproxy", "-d", "-c", conf.string()});
    EXPECT_GT(child->pid, 0);
    EXPECT_TRUE(testing::WaitForLoopbackPort(static_cast<uint16_t>(port)))
        << "tinyproxy did not listen";
    return port;
  }

  int64_t lifetime_ = 86400;
  milliseconds keepalive_ = seconds(20);
  std::map<std::string, std::string> env_;
  FakeRoot dir_, root_;
  DevPki pki_;
  std::unique_ptr<DevGateway> gateway_;
  std::ostringstream log_text_;
  Logger log_{&log_text_, LogLevel::kInfo};
  std::unique_ptr<Agent> daemon_;
  std::thread runner_;
  absl::Status result_;
};

TEST_F(WebSocket, ASessionRunsSignedCommandsAndEndsCleanly) {
  StartDaemon(JoinAs("n-1"));
  ASSERT_TRUE(gateway_->WaitForWelcomes(1, kWait));
  EXPECT_EQ(gateway_->LastTransport("n-1"), "websocket");
  ASSERT_TRUE(gateway_->WaitForReceived("n-1", 1, kWait));  // the StatusReport after Welcome
  EXPECT_NE(daemon_->StatusText().find("session: connected over websocket"), std::string::npos)
      << daemon_->StatusText();
  EXPECT_TRUE(gateway_->Received("n-1").front().has_status());
  ExpectInventoryRefresh("c-1");
  // A signed spec is applied too.
  v1::NodeSpec spec;
  spec.set_node_id("n-1");
  spec.set_generation(1);
  spec.mutable_daemon()->set_log_level("debug");
  v1::ServerFrame frame;
  *frame.mutable_desired_state() = pki_.SignSpec(spec);
  ASSERT_TRUE(gateway_->Push("n-1", frame));
  EXPECT_TRUE(testing::WaitFor([&] {
    bool acked = false;
    for (const auto& f : gateway_->Received("n-1")) {
      acked |= f.has_spec_ack() && f.spec_ack().state() == v1::SPEC_ACK_STATE_APPLIED;
    }
    return acked;
  }));
  StopDaemon();
  EXPECT_TRUE(result_.ok()) << result_;
  EXPECT_EQ(gateway_->WaitForWsClose("n-1", kWait), 1000);  // the close handshake, normal
  EXPECT_TRUE(gateway_->WaitForNoSession("n-1", kWait));
  EXPECT_EQ(gateway_->clean_ends(), 1);
}

TEST_F(WebSocket, RenewsOverHttpsAndTheNextDialUsesTheNewCertificate) {
  lifetime_ = 9;  // renewal due after ~6 s
  gateway_ = *DevGateway::Start(pki_, {.node_cert_lifetime = lifetime_});
  Config config = JoinAs("n-1");
  std::string first_leaf = ReadFile(dir_.path() / "state" / "identity.pem");
  StartDaemon(config);
  ASSERT_TRUE(gateway_->WaitForWelcomes(1, kWait));
  ASSERT_TRUE(daemon_->WaitForRenewals(1, seconds(30)));
  EXPECT_EQ(gateway_->websocket_renewals(), 1);
  EXPECT_EQ(gateway_->renewals(), 1);  // none over gRPC
  EXPECT_NE(ReadFile(dir_.path() / "state" / "identity.pem"), first_leaf);
  // The session goes on; a redial authenticates with the renewed chain: once the old one has
  // expired, a session proves it.
  int64_t old_expiry = pki::ParsePemChain(first_leaf)->front().NotAfter();
  ASSERT_TRUE(testing::WaitFor([&] { return Now() > old_expiry; }, seconds(15), milliseconds(50)));
  gateway_->DropSessions();
  ASSERT_TRUE(gateway_->WaitForWelcomes(2, kWait));
  ExpectInventoryRefresh("c-after-renewal");
}

TEST_F(WebSocket, RenewalRefusesASupersededCertificateAndARevokedNode) {
  lifetime_ = 9;
  gateway_ = *DevGateway::Start(pki_, {.node_cert_lifetime = lifetime_});
  Config config = JoinAs("n-1");
  StateDir state = *StateDir::Open(config.state_dir());
  Identity first = *state.LoadIdentity();
  StartDaemon(config);
  ASSERT_TRUE(daemon_->WaitForRenewals(1, seconds(30)));
  // The certificate from before the renewal (a copy someone kept) cannot renew any more.
  transport::WebSocketSpec spec = *WebSocketChannel(config, Now);
  spec.env = [](const char*) { return std::optional<std::string>(); };
  StateDir copy = *StateDir::Open(dir_.path() / "copy");
  transport::Refusal refusal;
  transport::WebSocketTransport websocket(spec, nullptr);
  absl::StatusOr<Identity> stale = RenewOnce(
      RenewThrough(&websocket), copy, first,
      pki::TrustState::FromFirstBundle(first.trust_bundle, first.join_service_key)->node_cas(), Now,
      &refusal);
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(refusal.reason, "superseded") << stale.status();
  EXPECT_NE(std::string(stale.status().message()).find("generation 1 was replaced by generation 2"),
            std::string::npos)
      << stale.status();
  // Revoked: the renewer stops at its next renewal (the session stays up until it ends), and the
  // session stops at its next dial.
  gateway_->Revoke("n-1");
  testing::WaitFor([&] { return log_.Text().find("renew.stopped") != std::string::npos; },
                   seconds(15));
  EXPECT_NE(log_.Text().find("event=renew.stopped error=\"renew refused (revoked)"),
            std::string::npos)
      << log_.Text();
  gateway_->DropSessions();
  runner_.join();
  EXPECT_EQ(result_.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(result_.message()).find("revoked"), std::string::npos) << result_;
  daemon_.reset();
}

TEST_F(WebSocket, GoesThroughTinyproxy) {
  Child proxy;
  int port = StartTinyproxy(&proxy);
  env_["https_proxy"] = "http://127.0.0.1:" + std::to_string(port);
  StartDaemon(JoinAs("n-1"));
  ASSERT_TRUE(gateway_->WaitForWelcomes(1, kWait));
  ExpectInventoryRefresh("c-1");
  std::string log = ReadFile(dir_.path() / "tinyproxy.log");
  EXPECT_NE(log.find("CONNECT"), std::string::npos) << log;
  EXPECT_NE(log.find(std::to_string(gateway_->websocket_port())), std::string::npos) << log;
}

TEST_F(WebSocket, GoesThroughTinyproxyWithBasicAuthAndRenewsThroughIt) {
  lifetime_ = 9;
  gateway_ = *DevGateway::Start(pki_, {.node_cert_lifetime = lifetime_});
  Child proxy;
  int port = StartTinyproxy(&proxy, "bcd s3cr-t");
  // Percent-encoded in the URL (as curl takes it): %2D is '-'.
  env_["HTTPS_PROXY"] = "http://bcd:s3cr%2Dt@127.0.0.1:" + std::to_string(port);
  StartDaemon(JoinAs("n-1"));
  ASSERT_TRUE(gateway_->WaitForWelcomes(1, kWait));
  ExpectInventoryRefresh("c-1");
  ASSERT_TRUE(daemon_->WaitForRenewals(1, seconds(30)));
  EXPECT_EQ(gateway_->websocket_renewals(), 1);
  std::string log = ReadFile(dir_.path() / "tinyproxy.log");
  std::size_t connects = 0;
  for (std::size_t at = log.find("CONNECT"); at != std::string::npos;
       at = log.find("CONNECT", at + 1)) {
    ++connects;
  }
  EXPECT_GE(connects, 2u) << log;  // the session and the renewal
  EXPECT_EQ(log_.Text().find("s3cr"), std::string::npos) << "the proxy password was logged";
}

TEST_F(WebSocket, AProxyThatRefusesTheCredentialsIsNamedAndRetried) {
  Child proxy;
  int port = StartTinyproxy(&proxy, "bcd right");
  env_["https_proxy"] = "http://bcd:wrong@127.0.0.1:" + std::to_string(port);
  StartDaemon(JoinAs("n-1"));
  ASSERT_TRUE(WaitForError("(it refused the credentials)")) << daemon_->Snapshot().last_error;
  EXPECT_EQ(gateway_->SessionNodes().size(), 0u);
  EXPECT_EQ(log_.Text().find("wrong"), std::string::npos) << "the proxy password was logged";
}

TEST_F(WebSocket, NoProxySendsTheGatewayDirect) {
  env_["https_proxy"] = "http://127.0.0.1:1";  // nothing listens there
  env_["no_proxy"] = "example.com, 127.0.0.0/8";
  StartDaemon(JoinAs("n-1"));
  ASSERT_TRUE(gateway_->WaitForWelcomes(1, kWait));
}

TEST_F(WebSocket, ATlsInspectingProxyIsTrustedForTransportWhileTheProofAuthenticatesTheGateway) {
  // The proxy's CA is another dev PKI's serving CA; its leaf carries 127.0.0.1.
  DevPki proxy_pki = *DevPki::Create(Now());
  std::filesystem::path key = dir_.path() / "proxy.key", cert = dir_.path() / "proxy.crt",
                        proxy_ca = dir_.path() / "proxy-ca.pem",
                        upstream_ca = dir_.path() / "upstream-ca.pem",
                        port_file = dir_.path() / "proxy.port";
  std::ofstream(key) << proxy_pki.serving_key().ToPem();
  std::ofstream(cert) << proxy_pki.ServingChainPem();
  std::ofstream(proxy_ca) << proxy_pki.serving_ca().Pem();
  std::ofstream(upstream_ca) << pki_.serving_ca().Pem();
  Child proxy;
  proxy.pid = testing::SpawnChild({"node", BCD_SOURCE_DIR "/tests/integration/inspecting_proxy.mjs",
                                   key.string(), cert.string(), upstream_ca.string(),
                                   DevPki::kGatewayName, port_file.string()});
  ASSERT_TRUE(testing::WaitFor([&] { return std::filesystem::exists(port_file); }))
      << "the inspecting proxy did not start";
  env_["https_proxy"] = "http://127.0.0.1:" + ReadFile(port_file);

  // Without proxy_ca_file the proxy's certificate is refused: it does not lead to the pin.
  Config pinned = JoinAs("n-1");
  StartDaemon(pinned);
  ASSERT_TRUE(WaitForError("does not lead to the pinned CA"));
  EXPECT_EQ(gateway_->SessionNodes().size(), 0u);
  StopDaemon();

  // With it, the transport trusts the proxy, and the gateway proof still comes from the gateway.
  Config inspected =
      *Config::Parse(gateway_->ConfigToml(dir_.path() / "state") + gateway_->WebSocketConfigToml() +
                         "proxy_ca_file = \"" + proxy_ca.string() + "\"\n",
                     "test.toml");
  StartDaemon(inspected);
  ASSERT_TRUE(gateway_->WaitForWelcomes(1, kWait));
  ExpectInventoryRefresh("c-1");
  StopDaemon();

  // A proxy that also forges the gateway's answer cannot make the proof.
  gateway_->SetWsFault(Fault::kProofForeignKey, 1000);
  StartDaemon(inspected);
  ASSERT_TRUE(WaitForError("does not lead to the pinned CA"));
  EXPECT_EQ(gateway_->SessionNodes().size(), 1u);  // the earlier one only
}

struct ProofCase {
  std::string name;
  Fault fault;
  std::string error;
};

void PrintTo(const ProofCase& c, std::ostream* os) { *os << c.name; }

class UnprovenGateway : public WebSocket, public ::testing::WithParamInterface<ProofCase> {};

TEST_P(UnprovenGateway, IsClosedBeforeAnyFrameAndRedialed) {
  gateway_->SetWsFault(GetParam().fault, 2);
  StartDaemon(JoinAs("n-1"));
  ASSERT_TRUE(WaitForError(GetParam().error)) << daemon_->Snapshot().last_error;
  // Not one frame (not even Hello) reached the gateway on these; after the faults, the session
  // comes up.
  ASSERT_TRUE(gateway_->WaitForWelcomes(1, kWait));
  EXPECT_EQ(gateway_->FramesAfterBadProof(), 0);
  EXPECT_EQ(gateway_->SessionNodes().size(), 1u);
  EXPECT_NE(log_.Text().find("gateway-proof"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Proofs, UnprovenGateway,
    ::testing::Values(
        ProofCase{"NoProof", Fault::kNoProof, "the 101 carries no x-bc-gateway-proof"},
        ProofCase{"OtherNode", Fault::kProofOtherNode,
                  "it names node \"someone-else\", this node is \"n-1\""},
        ProofCase{"OtherNonce", Fault::kProofOtherNonce, "it echoes another nonce"},
        ProofCase{"OldIat", Fault::kProofOldIat, "is not within 60 s of this node's clock"},
        ProofCase{"ForeignKey", Fault::kProofForeignKey, "does not lead to the pinned CA"}),
    [](const auto& info) { return info.param.name; });

TEST_F(WebSocket, UnsignedIntentStaysPendingAndInjectedUnsignedIntentIsRefused) {
  StartDaemon(JoinAs("n-1"));
  ASSERT_TRUE(gateway_->WaitForWelcomes(1, kWait));
  // The gateway holds what is not signed.
  ASSERT_TRUE(Push(pki_.SignCommand(Make("c-unsigned", "inventory.refresh"), /*sign=*/false)));
  EXPECT_EQ(gateway_->PendingUnsigned("n-1"), 1u);
  ExpectInventoryRefresh("c-signed");  // later than the held one, and it went through
  for (const auto& frame : gateway_->Received("n-1")) {
    EXPECT_FALSE(frame.has_command_update() && frame.command_update().command_id() == "c-unsigned");
  }
  // Injected past the gateway (what a proxy in the middle could do): refused, and reported.
  ASSERT_TRUE(Push(pki_.SignCommand(Make("c-injected", "inventory.refresh"), false), false));
  std::optional<v1::CommandUpdate> update = Terminal("c-injected");
  ASSERT_TRUE(update.has_value());
  EXPECT_EQ(update->state(), v1::COMMAND_STATE_REJECTED);
  EXPECT_EQ(update->code(), v1::COMMAND_CODE_UNSIGNED);
  v1::NodeSpec spec;
  spec.set_node_id("n-1");
  spec.set_generation(1);
  v1::ServerFrame frame;
  *frame.mutable_desired_state() = pki_.SignSpec(spec, /*sign=*/false);
  ASSERT_TRUE(gateway_->PushUnfiltered("n-1", frame));
  bool refused = false;
  EXPECT_TRUE(testing::WaitFor([&] {
    for (const auto& f : gateway_->Received("n-1")) {
      refused |= f.has_spec_ack() && f.spec_ack().state() == v1::SPEC_ACK_STATE_REJECTED &&
                 f.spec_ack().code() == "UNSIGNED";
    }
    return refused;
  }));
}

struct BadMessageCase {
  std::string name;
  Fault fault;
  int close_code;  // what bcd closes with (RFC 6455 7.4.1)
};

void PrintTo(const BadMessageCase& c, std::ostream* os) { *os << c.name; }

class BadMessage : public WebSocket, public ::testing::WithParamInterface<BadMessageCase> {};

TEST_P(BadMessage, EndsTheSessionWithTheRightCloseCodeAndRedials) {
  gateway_->SetWsFault(GetParam().fault, 1);
  StartDaemon(JoinAs("n-1"));
  std::optional<int> code = gateway_->WaitForWsClose("n-1", kWait);
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, GetParam().close_code);
  gateway_->ForgetWsClose("n-1");
  ASSERT_TRUE(gateway_->WaitForWelcomes(1, kWait));  // the next session is a good one
  ExpectInventoryRefresh("c-1");
}

INSTANTIATE_TEST_SUITE_P(Messages, BadMessage,
                         ::testing::Values(BadMessageCase{"Text", Fault::kTextMessage, 1003},
                                           BadMessageCase{"Oversized", Fault::kOversizedMessage,
                                                          1009},
                                           BadMessageCase{"Masked", Fault::kBadMask, 1002}),
                         [](const auto& info) { return info.param.name; });

TEST_F(WebSocket, AGatewayThatStopsAnsweringPingsIsDetectedAndRedialed) {
  keepalive_ = milliseconds(400);
  gateway_->SetWsFault(Fault::kSilent, 1);
  StartDaemon(JoinAs("n-1"));
  ASSERT_TRUE(gateway_->WaitForWelcomes(1, kWait));
  EXPECT_EQ(gateway_->SessionNodes().size(), 1u);
  EXPECT_NE(log_.Text().find("timeout"), std::string::npos) << log_.Text();
}

TEST_F(WebSocket, RefusesToRunWithoutCommandSigningRoots) {
  gateway_ = *DevGateway::Start(pki_, {.command_signing = false});
  absl::StatusOr<std::unique_ptr<Agent>> daemon = Create(JoinAs("n-1"));
  ASSERT_FALSE(daemon.ok());
  EXPECT_EQ(daemon.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(daemon.status().message()).find("has no command-signing roots"),
            std::string::npos)
      << daemon.status();
}

TEST_F(WebSocket, RefusalsOnTheUpgradeSteerTheRedial) {
  gateway_->RefuseSessions(1, 14, "draining", 300);
  StartDaemon(JoinAs("n-1"));
  ASSERT_TRUE(gateway_->WaitForWelcomes(1, kWait));
  EXPECT_NE(log_.Text().find("reason=draining"), std::string::npos) << log_.Text();
  StopDaemon();
  gateway_->RefuseSessions(1, 7, "revoked", 0);
  StartDaemon(JoinAs("n-2", "state-2"));
  runner_.join();
  EXPECT_EQ(result_.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(result_.message()).find("revoked"), std::string::npos) << result_;
  daemon_.reset();
}

TEST_F(WebSocket, TunnelsAreRefusedOnAWebSocketSession) {
  StartDaemon(JoinAs("n-1"));
  ASSERT_TRUE(gateway_->WaitForWelcomes(1, kWait));
  v1::ServerFrame frame;
  frame.mutable_open_tunnel()->set_tunnel_id("t-1");
  frame.mutable_open_tunnel()->set_ticket("x.y.z");
  ASSERT_TRUE(gateway_->Push("n-1", frame));
  bool refused = false;
  EXPECT_TRUE(testing::WaitFor([&] {
    for (const auto& f : gateway_->Received("n-1")) {
      refused |= f.has_event() && f.event().kind() == "tunnel.refused" &&
                 f.event().attributes().at("tunnel_id") == "t-1";
    }
    return refused;
  }));
}

}  // namespace
}  // namespace bcd
