// Tunnels end to end: the dev gateway signs a ticket and asks; bcd checks it again, opens a Tunnel
// stream on its gRPC connection and runs the op with real processes, a real PTY and real sockets.

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "daemon/agent.h"
#include "daemon/dispatch/desired.h"
#include "daemon/identity/join.h"
#include "gtest/gtest.h"
#include "modes/node/node_mode.h"
#include "testing/child_process.h"
#include "testing/dev_gateway.h"
#include "testing/wait.h"
#include "tests/integration/joined_node.h"
#include "tests/unit/fake_root.h"

namespace bcd {
namespace {

namespace v1 = bettercompute::agent::v1;
using bcd::testing::DevGateway;
using bcd::testing::DevPki;
using bcd::testing::DevTunnel;
using bcd::testing::DevTunnelRequest;
using bcd::testing::FakeRoot;
using bcd::testing::JoinedNode;
using bcd::testing::WaitFor;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr auto kWait = seconds(20);

// The spec whose access section holds the keys the dev gateway signs tickets with.
v1::ServerFrame AccessSpec(const DevPki& pki, const DevGateway& gateway, const std::string& node) {
  v1::NodeSpec spec;
  spec.set_node_id(node);
  spec.set_generation(1);
  *spec.mutable_access() = gateway.TunnelAccess();
  v1::ServerFrame frame;
  *frame.mutable_desired_state() = pki.SignSpec(spec);
  return frame;
}
constexpr auto kRefusalWait = milliseconds(300);

int64_t Now() { return static_cast<int64_t>(std::time(nullptr)); }

// A TCP echo server on loopback, one connection at a time; counts connections that ended.
class EchoServer {
 public:
  EchoServer() {
    fd_ = testing::ListenOnLoopback(&port_);
    thread_ = std::thread([this] {
      while (true) {
        int client = accept(fd_, nullptr, nullptr);
        if (client < 0) return;
        char buffer[4096];
        ssize_t n;
        while ((n = read(client, buffer, sizeof buffer)) > 0) {
          if (write(client, buffer, static_cast<std::size_t>(n)) != n) break;
        }
        close(client);
        ++ended_;
      }
    });
  }
  ~EchoServer() {
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }
  uint16_t port() const { return port_; }
  int ended() const { return ended_.load(); }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<int> ended_{0};
  std::thread thread_;
};

class Tunnels : public ::testing::Test {
 protected:
  Tunnels() {
    node_.Start(std::make_unique<NodeMode>());
    EXPECT_TRUE(gateway_->WaitForWelcomes(1, kWait));
    // The access section: the keys tickets are checked against.
    EXPECT_TRUE(gateway_->Push("n-1", AccessSpec(pki_, *gateway_, "n-1")));
    EXPECT_TRUE(Applied());
  }
  ~Tunnels() override {
    node_.Stop();
    gateway_.reset();
  }

  bool Applied() {
    return WaitFor([&] {
      for (const auto& f : gateway_->Received("n-1")) {
        if (f.has_spec_ack() && f.spec_ack().state() == v1::SPEC_ACK_STATE_APPLIED) return true;
      }
      return false;
    });
  }

  DevTunnel Exec(std::vector<std::string> cmd) {
    return gateway_->OpenTunnel("n-1", {.op = "exec", .cmd = std::move(cmd)});
  }

  // The reasons of tunnel.refused events so far.
  std::vector<std::string> Refusals() {
    std::vector<std::string> reasons;
    for (const auto& f : gateway_->Received("n-1")) {
      if (f.has_event() && f.event().kind() == "tunnel.refused") {
        reasons.push_back(f.event().message());
      }
    }
    return reasons;
  }

  // A ticket that bcd refuses opens nothing and is reported with `reason`.
  void ExpectRefused(const DevTunnelRequest& request, const std::string& reason) {
    std::size_t before = Refusals().size();
    DevTunnel tunnel = gateway_->OpenTunnel("n-1", request);
    std::vector<std::string> refusals;
    WaitFor([&] {
      refusals = Refusals();
      return refusals.size() > before;
    });
    ASSERT_GT(refusals.size(), before) << reason;
    // The refusal comes before anything would open; nothing does.
    EXPECT_FALSE(tunnel.WaitOpened(kRefusalWait)) << reason;
    EXPECT_NE(refusals.back().find(reason), std::string::npos) << refusals.back();
    EXPECT_EQ(log_.Text().find(tunnel.ticket()), std::string::npos) << "a ticket was logged";
  }

  JoinedNode node_{{.log_level = LogLevel::kInfo, .now = Now}};
  FakeRoot& dir_ = node_.dir;
  DevPki& pki_ = node_.pki;
  std::unique_ptr<DevGateway>& gateway_ = node_.gateway;
  std::ostringstream& log_text_ = node_.log_text;
  Logger& log_ = node_.log;
  std::unique_ptr<Agent>& daemon_ = node_.agent;
};

TEST_F(Tunnels, HelloAdvertisesWhatThisBuildDoes) {
  v1::Hello hello = *gateway_->LastHello("n-1");
  std::vector<std::string> caps(hello.capabilities().begin(), hello.capabilities().end());
  EXPECT_EQ(caps, (std::vector<std::string>{"tunnel.shell", "tunnel.exec", "tunnel.tcp",
                                            "secrets.jwe", "spec.daemon", "spec.access",
                                            "tunnel.instance-dial", "workload-token"}));
}

TEST_F(Tunnels, ExecSeparatesStdoutFromStderrAndReportsTheExitCode) {
  DevTunnel tunnel = Exec({"sh", "-c", "echo out; echo err >&2; exit 3"});
  ASSERT_TRUE(tunnel.WaitOpened(kWait));
  DevTunnel::Outcome outcome = tunnel.Collect(kWait);
  EXPECT_TRUE(outcome.closed);
  EXPECT_EQ(outcome.out, "out\n");
  EXPECT_EQ(outcome.err, "err\n");
  EXPECT_EQ(outcome.exit_code, 3);
  EXPECT_TRUE(tunnel.WaitEnded(kWait));
}

TEST_F(Tunnels, ExecTakesStdinAndAnEmptyFrameEndsIt) {
  DevTunnel tunnel = Exec({"tr", "a-z", "A-Z"});
  ASSERT_TRUE(tunnel.WaitOpened(kWait));
  ASSERT_TRUE(tunnel.Send(0, "hello tunnel\n"));
  ASSERT_TRUE(tunnel.Send(0, ""));  // EOF
  DevTunnel::Outcome outcome = tunnel.Collect(kWait);
  EXPECT_EQ(outcome.out, "HELLO TUNNEL\n");
  EXPECT_EQ(outcome.exit_code, 0);
}

TEST_F(Tunnels, ExecOfAMissingProgramExits127) {
  DevTunnel tunnel = Exec({"no-such-program-here"});
  ASSERT_TRUE(tunnel.WaitOpened(kWait));
  EXPECT_EQ(tunnel.Collect(kWait).exit_code, 127);
}

TEST_F(Tunnels, ShellRunsOnAPtyAndSeesResizes) {
  DevTunnel tunnel = gateway_->OpenTunnel("n-1", {.op = "shell", .rows = 30, .cols = 100});
  ASSERT_TRUE(tunnel.WaitOpened(kWait));
  ASSERT_TRUE(tunnel.Send(0, "stty size; tty\n"));
  std::string out = tunnel.ReadUntil("/dev/pts/", kWait);
  EXPECT_NE(out.find("30 100"), std::string::npos) << out;
  ASSERT_TRUE(tunnel.Resize(40, 120));
  ASSERT_TRUE(tunnel.Send(0, "stty size\n"));
  out = tunnel.ReadUntil("40 120", kWait);
  EXPECT_NE(out.find("40 120"), std::string::npos) << out;
  ASSERT_TRUE(tunnel.Send(0, "exit 7\n"));
  DevTunnel::Outcome outcome = tunnel.Collect(kWait);
  EXPECT_TRUE(outcome.closed);
  EXPECT_EQ(outcome.exit_code, 7);
}

// The real bcd with `[tunnels] user = "nobody"`, in a mount namespace where nobody's login shell
// is /bin/sh (it is nologin on the host): what shell and exec run, runs as nobody.
TEST(TunnelUser, ShellAndExecRunAsTheConfiguredUser) {
  if (geteuid() != 0) GTEST_SKIP() << "switching to another user needs bcd to run as root";
  FakeRoot dir;
  DevPki pki = *DevPki::Create(Now());
  std::unique_ptr<DevGateway> gateway = *DevGateway::Start(pki, {});
  std::string config_path = (dir.path() / "config.toml").string();
  dir.Write("config.toml",
            gateway->ConfigToml(dir.path() / "state") + "[tunnels]\nuser = \"nobody\"\n");
  Config config = *Config::Load(config_path);
  JoinSpec spec{.evidence = gateway->AddJoinToken("n-9"), .now = Now, .sleep = [](seconds) {}};
  ASSERT_TRUE(JoinFleet(config, spec).ok());
  std::ifstream in("/etc/passwd");
  std::string passwd, line;
  while (std::getline(in, line)) {
    if (line.rfind("nobody:", 0) == 0) line = line.substr(0, line.rfind(':')) + ":/bin/sh";
    passwd += line + "\n";
  }
  dir.Write("passwd", passwd);
  pid_t node =
      testing::SpawnChild({"unshare", "-m", "sh", "-c",
                           "mount --bind " + (dir.path() / "passwd").string() +
                               " /etc/passwd && exec " BCD_BINARY " node --config " + config_path});
  ASSERT_GT(node, 0);
  ASSERT_TRUE(gateway->WaitForWelcomes(1, kWait));
  ASSERT_TRUE(gateway->Push("n-9", AccessSpec(pki, *gateway, "n-9")));
  ASSERT_TRUE(gateway->WaitForReceived("n-9", 2, kWait));

  DevTunnel exec = gateway->OpenTunnel("n-9", {.op = "exec", .cmd = {"sh", "-c", "id -u; id -g"}});
  ASSERT_TRUE(exec.WaitOpened(kWait));
  DevTunnel::Outcome outcome = exec.Collect(kWait);
  EXPECT_EQ(outcome.out, "65534\n65534\n") << outcome.err;
  DevTunnel shell = gateway->OpenTunnel("n-9", {.op = "shell"});
  ASSERT_TRUE(shell.WaitOpened(kWait));
  ASSERT_TRUE(shell.Send(0, "echo uid=$(id -u); exit\n"));
  std::string out = shell.ReadUntil("uid=65534", kWait);
  EXPECT_NE(out.find("uid=65534"), std::string::npos) << out;
  kill(node, SIGTERM);
  EXPECT_EQ(testing::WaitChild(node), 0);
}

TEST_F(Tunnels, TcpReachesAnAllowedPortAndClosingEndsTheConnection) {
  EchoServer echo;
  DevTunnel tunnel =
      gateway_->OpenTunnel("n-1", {.op = "tcp", .host = "127.0.0.1", .port = echo.port()});
  ASSERT_TRUE(tunnel.WaitOpened(kWait));
  ASSERT_TRUE(tunnel.Send(0, "ping over the tunnel"));
  EXPECT_EQ(tunnel.ReadUntil("ping over the tunnel", kWait), "ping over the tunnel");
  ASSERT_TRUE(tunnel.Close());
  DevTunnel::Outcome outcome = tunnel.Collect(kWait);
  EXPECT_TRUE(outcome.closed);
  WaitFor([&] { return echo.ended() != 0; }, seconds(2));
  EXPECT_EQ(echo.ended(), 1);
  EXPECT_TRUE(tunnel.WaitEnded(kWait));
}

TEST_F(Tunnels, TcpToAHostTheAllowListDoesNotNameIsClosedWithTheReason) {
  DevTunnel tunnel = gateway_->OpenTunnel("n-1", {.op = "tcp", .host = "192.0.2.1", .port = 22});
  ASSERT_TRUE(tunnel.WaitOpened(kWait));
  DevTunnel::Outcome outcome = tunnel.Collect(kWait);
  EXPECT_TRUE(outcome.closed);
  EXPECT_NE(outcome.reason.find("192.0.2.1:22 (192.0.2.1) is not allowed by [tunnels] allow"),
            std::string::npos)
      << outcome.reason;
}

TEST_F(Tunnels, InstanceTcpReachesAnInstanceOfTheVpsSection) {
  EchoServer echo;
  v1::NodeSpec node_spec;
  node_spec.set_node_id("n-1");
  node_spec.set_generation(2);
  *node_spec.mutable_access() = gateway_->TunnelAccess();
  v1::VpsInstance* instance = node_spec.mutable_vps()->add_instances();
  instance->set_instance_id("vm-1");
  instance->set_address("127.0.0.1");
  v1::ServerFrame frame;
  *frame.mutable_desired_state() = pki_.SignSpec(node_spec);
  ASSERT_TRUE(gateway_->Push("n-1", frame));
  WaitFor([&] { return daemon_->desired().applied_generation() >= 2; });
  DevTunnel tunnel =
      gateway_->OpenTunnel("n-1", {.op = "instance-tcp", .port = echo.port(), .instance = "vm-1"});
  ASSERT_TRUE(tunnel.WaitOpened(kWait));
  ASSERT_TRUE(tunnel.Send(0, "to the instance"));
  EXPECT_EQ(tunnel.ReadUntil("to the instance", kWait), "to the instance");
  tunnel.Cancel();
  DevTunnel unknown =
      gateway_->OpenTunnel("n-1", {.op = "instance-tcp", .port = echo.port(), .instance = "vm-9"});
  ASSERT_TRUE(unknown.WaitOpened(kWait));
  EXPECT_NE(unknown.Collect(kWait).reason.find("no instance \"vm-9\""), std::string::npos);
}

TEST_F(Tunnels, RefusedTicketsOpenNothing) {
  ExpectRefused({.op = "exec", .cmd = {"true"}, .aud = "node:n-2"}, "aud");
  ExpectRefused({.op = "exec", .cmd = {"true"}, .clock_offset = -600}, "exp");
  ExpectRefused({.op = "exec", .cmd = {"true"}, .sid = "another-session"}, "sid");
  ExpectRefused({.op = "exec", .cmd = {"true"}, .kid = "unknown-kid"}, "kid");
  ExpectRefused({.op = "exec", .cmd = {"true"}, .foreign_key = true}, "signature");
  // alg none and HS256: a JWS header bcd must not accept whatever the rest says.
  ExpectRefused({.ticket = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJhdWQiOiJub2RlOm4tMSJ9."}, "alg");
  ExpectRefused(
      {.ticket = "eyJhbGciOiJIUzI1NiIsImtpZCI6ImRldi1hY2Nlc3MifQ.eyJhdWQiOiJub2RlOm4tMSJ9."
                 "c2lnbmF0dXJl"},
      "alg");
  // A jti used once cannot open a second tunnel.
  DevTunnel first = gateway_->OpenTunnel("n-1", {.op = "exec", .cmd = {"true"}, .jti = "once"});
  ASSERT_TRUE(first.WaitOpened(kWait));
  first.Collect(kWait);
  ExpectRefused({.op = "exec", .cmd = {"true"}, .jti = "once"}, "jti was used before");
}

TEST_F(Tunnels, TheSeventeenthIsRefusedAndClosingOneMakesRoom) {
  std::vector<DevTunnel> open;
  for (int i = 0; i < 16; ++i) {
    open.push_back(Exec({"sleep", "60"}));
    ASSERT_TRUE(open.back().WaitOpened(kWait)) << i;
  }
  EXPECT_EQ(daemon_->tunnels_open(), 16);
  ExpectRefused({.op = "exec", .cmd = {"true"}}, "16 tunnels are open");
  open.front().Cancel();
  WaitFor([&] { return daemon_->tunnels_open() <= 15; });
  DevTunnel next = Exec({"echo", "room"});
  ASSERT_TRUE(next.WaitOpened(kWait));
  EXPECT_EQ(next.Collect(kWait).out, "room\n");
}

// Whether `pid` is gone (or a zombie: killed, waiting to be reaped).
bool Dead(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  std::size_t paren = text.rfind(')');
  return text.empty() || (paren != std::string::npos && text.substr(paren + 2, 1) == "Z");
}

bool WaitDead(pid_t pid) {
  return WaitFor([&] { return Dead(pid); });
}

TEST_F(Tunnels, ClosingMidTransferKillsTheProcessGroup) {
  DevTunnel tunnel = Exec({"sh", "-c", "sleep 300 & echo $!; echo $$; cat /dev/zero"});
  ASSERT_TRUE(tunnel.WaitOpened(kWait));
  std::string out = tunnel.ReadUntil("\n", kWait);
  std::istringstream pids(out);
  pid_t child = 0, shell = 0;
  pids >> child >> shell;
  ASSERT_GT(child, 0) << out;
  tunnel.Cancel();
  // Gone, or a zombie waiting for whoever reaps orphans here (killed all the same).
  EXPECT_TRUE(WaitDead(child) && WaitDead(shell)) << "the tunnel's processes outlived it";
  WaitFor([&] { return daemon_->tunnels_open() == 0; });
  EXPECT_EQ(daemon_->tunnels_open(), 0);
}

TEST_F(Tunnels, AProcessThatLeftTheProcessGroupGoesWithTheTunnelToo) {
  // setsid: a new session and process group; the subshell's double fork: parented to nobody.
  DevTunnel tunnel =
      Exec({"sh", "-c", "setsid sleep 300 & echo $!; (sleep 301 & echo $!) ; cat /dev/zero"});
  ASSERT_TRUE(tunnel.WaitOpened(kWait));
  std::string out = tunnel.ReadUntil("\n", kWait);
  while (std::count(out.begin(), out.end(), '\n') < 2) out += tunnel.ReadUntil("\n", kWait);
  std::istringstream pids(out);
  pid_t escaped = 0, orphan = 0;
  pids >> escaped >> orphan;
  ASSERT_GT(escaped, 0) << out;
  ASSERT_GT(orphan, 0) << out;
  ASSERT_FALSE(Dead(escaped));
  tunnel.Cancel();
  EXPECT_TRUE(WaitDead(escaped)) << "a setsid'd process outlived its tunnel";
  EXPECT_TRUE(WaitDead(orphan)) << "an orphaned process outlived its tunnel";
  kill(escaped, SIGKILL);  // when they did, they go now (they hold the tunnel's output open)
  kill(orphan, SIGKILL);
}

TEST_F(Tunnels, WhatACommandLeavesBehindEndsWithItAndItsExitCodeIsKept) {
  DevTunnel tunnel = Exec({"sh", "-c", "setsid sleep 300 >/dev/null 2>&1 & echo $!; exit 5"});
  ASSERT_TRUE(tunnel.WaitOpened(kWait));
  DevTunnel::Outcome outcome = tunnel.Collect(kWait);
  EXPECT_TRUE(outcome.closed);
  EXPECT_EQ(outcome.exit_code, 5);
  pid_t left = std::atoi(outcome.out.c_str());
  ASSERT_GT(left, 0) << outcome.out;
  EXPECT_TRUE(WaitDead(left));
  kill(left, SIGKILL);
}

TEST_F(Tunnels, ACommandGetsItsStandardFdsAndNothingElseOfTheProcess) {
  DevTunnel tunnel = Exec({"sh", "-c", "echo $$; exec sleep 30"});
  ASSERT_TRUE(tunnel.WaitOpened(kWait));
  pid_t pid = std::atoi(tunnel.ReadUntil("\n", kWait).c_str());
  ASSERT_GT(pid, 0);
  // While sleep starts, its loader and setlocale hold a file open for a moment: wait for the set
  // to settle. An inherited socket or pipe never goes away, so the check still fails on a leak.
  std::set<int> fds;
  WaitFor(
      [&] {
        fds.clear();
        std::error_code error;
        for (const auto& entry :
             std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", error))
          fds.insert(std::stoi(entry.path().filename().string()));
        return fds == std::set<int>{0, 1, 2};
      },
      seconds(5));
  EXPECT_EQ(fds, (std::set<int>{0, 1, 2}))
      << "a socket or pipe of bcd (or of the gateway beside it)";
  tunnel.Cancel();
}

TEST_F(Tunnels, ChildrenDoNotInheritBcdsPrivateUmask) {
  mode_t before = umask(077);  // as the unit runs bcd
  DevTunnel tunnel = Exec({"sh", "-c", "umask"});
  bool opened = tunnel.WaitOpened(kWait);
  umask(before);
  ASSERT_TRUE(opened);
  EXPECT_EQ(tunnel.Collect(kWait).out, "0022\n");
}

// Applies a spec of generation `generation` with `access`; the ack's state of the access section.
v1::SectionState ApplyAccess(DevGateway& gateway, DevPki& pki, uint64_t generation,
                             const v1::AccessSection& access, std::string* message) {
  v1::NodeSpec node_spec;
  node_spec.set_node_id("n-1");
  node_spec.set_generation(generation);
  *node_spec.mutable_access() = access;
  v1::ServerFrame frame;
  *frame.mutable_desired_state() = pki.SignSpec(node_spec);
  EXPECT_TRUE(gateway.Push("n-1", frame));
  v1::SectionState state = v1::SECTION_STATE_UNSPECIFIED;
  WaitFor([&] {
    for (const auto& f : gateway.Received("n-1")) {
      if (!f.has_spec_ack() || f.spec_ack().generation() != generation) continue;
      for (const v1::SectionStatus& section : f.spec_ack().sections()) {
        if (section.name() != "access") continue;
        *message = section.message();
        state = section.state();
        return true;
      }
    }
    return false;
  });
  return state;
}

TEST_F(Tunnels, TheAccessSectionDecidesWhichOpsAndHowManyTunnels) {
  std::string message;
  v1::AccessSection access = gateway_->TunnelAccess({"exec"});
  access.set_max_tunnels(2);
  ASSERT_EQ(ApplyAccess(*gateway_, pki_, 2, access, &message), v1::SECTION_STATE_APPLIED)
      << message;
  ExpectRefused({.op = "shell"}, "op \"shell\" is not in the access section's allowed_ops");
  ExpectRefused({.op = "tcp", .host = "127.0.0.1", .port = 22},
                "op \"tcp\" is not in the access section's allowed_ops");
  DevTunnel one = Exec({"sleep", "60"}), two = Exec({"sleep", "60"});
  ASSERT_TRUE(one.WaitOpened(kWait));
  ASSERT_TRUE(two.WaitOpened(kWait));
  ExpectRefused({.op = "exec", .cmd = {"true"}},
                "2 tunnels are open, the most the access section and [tunnels] max allow");
  one.Cancel();
  two.Cancel();
  // An empty allowed_ops allows nothing.
  ASSERT_EQ(ApplyAccess(*gateway_, pki_, 3, gateway_->TunnelAccess({}), &message),
            v1::SECTION_STATE_APPLIED);
  ExpectRefused({.op = "exec", .cmd = {"true"}},
                "op \"exec\" is not in the access section's allowed_ops");
  // A section bcd cannot apply whole is FAILED, and opens nothing.
  access = gateway_->TunnelAccess({"exec", "rm"});
  EXPECT_EQ(ApplyAccess(*gateway_, pki_, 4, access, &message), v1::SECTION_STATE_FAILED);
  EXPECT_EQ(message, "allowed_ops: \"rm\" is not shell, exec, tcp or instance-tcp");
  ExpectRefused({.op = "exec", .cmd = {"true"}},
                "the access section was not applied: allowed_ops: \"rm\" is not shell, exec, "
                "tcp or instance-tcp");
  access = gateway_->TunnelAccess();
  access.set_max_tunnels(17);
  EXPECT_EQ(ApplyAccess(*gateway_, pki_, 5, access, &message), v1::SECTION_STATE_FAILED);
  EXPECT_EQ(message, "max_tunnels 17 is above 16");
}

TEST_F(Tunnels, AReaderThatStopsReadingStopsTheWriter) {
  // The writer counts 64 KiB blocks in a file; nobody reads the tunnel for a while.
  std::string counter = (dir_.path() / "blocks").string();
  DevTunnel tunnel = Exec(
      {"sh", "-c",
       "i=0; while :; do head -c 65536 /dev/zero; i=$((i+1)); echo $i > " + counter + "; done"});
  ASSERT_TRUE(tunnel.WaitOpened(kWait));
  auto blocks = [&] {
    std::ifstream in(counter);
    long n = 0;
    in >> n;
    return n;
  };
  // It stalls once the buffers between it and the reader are full (however long filling them
  // takes on a busy machine).
  long stalled = -1;
  bool still = false;  // no block written between two looks 500 ms apart
  for (int i = 0; i < 40 && !still; ++i) {
    std::this_thread::sleep_for(milliseconds(500));
    long now = blocks();
    still = now > 0 && now == stalled;
    stalled = now;
  }
  EXPECT_TRUE(still) << "the writer kept going with no reader (" << stalled << " blocks)";
  // Bounded by the pipe, bcd's buffer, gRPC's windows and the gateway's queue of 4: a few MiB.
  EXPECT_LT(stalled * 64, 32 * 1024) << stalled << " blocks of 64 KiB buffered somewhere";
  // Reading again lets it go on (once what was buffered is read).
  auto deadline = std::chrono::steady_clock::now() + kWait;
  while (blocks() <= stalled && std::chrono::steady_clock::now() < deadline) {
    tunnel.Next(milliseconds(100));
  }
  EXPECT_GT(blocks(), stalled);
  tunnel.Cancel();
}

// Accepts connections and never reads them.
class DeafServer {
 public:
  DeafServer() {
    fd_ = testing::ListenOnLoopback(&port_);
    thread_ = std::thread([this] {
      int client;
      while ((client = accept(fd_, nullptr, nullptr)) >= 0) clients_.push_back(client);
    });
  }
  ~DeafServer() {
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
    for (int client : clients_) close(client);
  }
  uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
  std::vector<int> clients_;  // touched by the accepting thread only, until it is joined
  std::thread thread_;
};

TEST_F(Tunnels, SixteenTunnelsWhoseEndsStopReadingNeverEndTheSession) {
  DeafServer deaf;
  std::vector<DevTunnel> tunnels;
  for (int i = 0; i < 16; ++i) {
    tunnels.push_back(
        gateway_->OpenTunnel("n-1", {.op = "tcp", .host = "127.0.0.1", .port = deaf.port()}));
    ASSERT_TRUE(tunnels.back().WaitOpened(kWait)) << i;
  }
  // Each operator pushes 8 MiB at a destination that reads nothing: what bcd lets the gateway
  // send ahead is all that piles up, and the flow control holds the rest back.
  std::vector<std::thread> senders;
  std::atomic<long> chunks{0};
  for (DevTunnel& tunnel : tunnels) {
    senders.emplace_back([&tunnel, &chunks] {
      std::string chunk(32 * 1024, 'x');
      for (int i = 0; i < 256 && tunnel.Send(0, chunk); ++i) ++chunks;
    });
  }
  // The senders block once what bcd lets the gateway send ahead is full: wait (bounded) until no
  // chunk has gone for 500 ms.
  long before = -1;
  for (int i = 0; i < 40 && chunks != before; ++i) {
    before = chunks;
    std::this_thread::sleep_for(milliseconds(500));
  }
  EXPECT_EQ(chunks.load(), before) << "the senders never stopped: nothing held them back";
  EXPECT_LT(chunks.load(), 16 * 256) << "every byte went: nothing held them back";
  EXPECT_EQ(gateway_->SessionNodes().size(), 1u) << "the session was ended and redialed";
  EXPECT_EQ(daemon_->Snapshot().welcomes, 1);
  EXPECT_EQ(daemon_->tunnels_open(), 16);
  for (DevTunnel& tunnel : tunnels) tunnel.Cancel();
  for (std::thread& sender : senders) sender.join();
}

TEST_F(Tunnels, TunnelsEndWithTheirSession) {
  DevTunnel tunnel = Exec({"sleep", "60"});
  ASSERT_TRUE(tunnel.WaitOpened(kWait));
  EXPECT_EQ(daemon_->tunnels_open(), 1);
  gateway_->DropSessions();
  WaitFor([&] { return daemon_->tunnels_open() == 0; });
  EXPECT_EQ(daemon_->tunnels_open(), 0);
}

}  // namespace
}  // namespace bcd
