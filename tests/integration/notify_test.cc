// bcd under systemd's service protocol: the real binary with $NOTIFY_SOCKET pointing at a datagram
// socket the test reads, as systemd's would be.

#include "app/notify.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "config/config.h"
#include "daemon/identity/join.h"
#include "gtest/gtest.h"
#include "testing/child_process.h"
#include "testing/dev_gateway.h"
#include "tests/unit/fake_root.h"

namespace bcd {
namespace {

using bcd::testing::DevGateway;
using bcd::testing::DevPki;
using bcd::testing::FakeRoot;

// A datagram socket bound at `path`; Receive waits up to `ms` for one message.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path.c_str(), sizeof address.sun_path - 1);
    bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address);
    timeval timeout{0, 200000};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  }
  ~NotifySocket() { close(fd_); }
  std::optional<std::string> Receive(int ms) {
    char buffer[4096];
    for (int waited = 0; waited < ms; waited += 200) {
      ssize_t n = recv(fd_, buffer, sizeof buffer, 0);
      if (n > 0) return std::string(buffer, static_cast<std::size_t>(n));
    }
    return std::nullopt;
  }
  // Messages until one starts with `prefix` (or the timeout); whether it came.
  bool WaitFor(const std::string& prefix, int ms) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < deadline) {
      std::optional<std::string> message = Receive(200);
      if (message && message->rfind(prefix, 0) == 0) return true;
    }
    return false;
  }

 private:
  int fd_ = -1;
};

// A config for `gateway` in `dir`, its node n-1 joined; "" when the join failed.
std::string JoinedConfig(const FakeRoot& dir, DevGateway& gateway) {
  std::string config_path = (dir.path() / "config.toml").string();
  std::ofstream(config_path) << gateway.ConfigToml(dir.path() / "state");
  Config config = *Config::Load(config_path);
  JoinSpec spec{.evidence = gateway.AddJoinToken("n-1"),
                .now = [] { return static_cast<int64_t>(std::time(nullptr)); },
                .sleep = [](std::chrono::seconds) {}};
  return JoinFleet(config, spec).ok() ? config_path : "";
}

TEST(SystemdNotify, ReadsTheEnvironmentLikeSdNotify) {
  auto env = [](std::map<std::string, std::string> values) {
    return [values](const char* name) -> std::optional<std::string> {
      auto it = values.find(name);
      return it == values.end() ? std::nullopt : std::optional<std::string>(it->second);
    };
  };
  EXPECT_FALSE(SystemdNotifier::FromEnvironment(env({})).has_value());
  EXPECT_FALSE(SystemdNotifier::FromEnvironment(env({{"NOTIFY_SOCKET", "relative"}})).has_value());
  auto plain = SystemdNotifier::FromEnvironment(env({{"NOTIFY_SOCKET", "/run/x"}}));
  ASSERT_TRUE(plain.has_value());
  EXPECT_FALSE(plain->watchdog_interval().has_value());
  auto watched = SystemdNotifier::FromEnvironment(
      env({{"NOTIFY_SOCKET", "@abstract"}, {"WATCHDOG_USEC", "10000000"}}));
  ASSERT_TRUE(watched.has_value());
  EXPECT_EQ(watched->watchdog_interval(), std::chrono::seconds(5));
  // A watchdog meant for another process is not ours.
  auto other = SystemdNotifier::FromEnvironment(
      env({{"NOTIFY_SOCKET", "/run/x"}, {"WATCHDOG_USEC", "100"}, {"WATCHDOG_PID", "1"}}));
  EXPECT_FALSE(other->watchdog_interval().has_value());
}

TEST(SystemdNotify, ReadyAfterTheFirstSessionThenWatchdogThenStopping) {
  FakeRoot dir;
  DevPki pki = *DevPki::Create(std::time(nullptr));
  auto gateway = *DevGateway::Start(pki, {});
  std::string config_path = JoinedConfig(dir, *gateway);
  ASSERT_FALSE(config_path.empty());
  std::string socket_path = (dir.path() / "notify").string();
  NotifySocket socket(socket_path);
  setenv("NOTIFY_SOCKET", socket_path.c_str(), 1);
  setenv("WATCHDOG_USEC", "400000", 1);
  pid_t node = testing::SpawnChild({BCD_BINARY, "node", "--config", config_path});
  unsetenv("NOTIFY_SOCKET");
  unsetenv("WATCHDOG_USEC");
  std::optional<std::string> ready = socket.Receive(20000);
  ASSERT_TRUE(ready.has_value());
  EXPECT_EQ(*ready, "READY=1\nSTATUS=connected");
  EXPECT_GE(gateway->SessionNodes().size(), 1u);  // the session was up before READY
  EXPECT_TRUE(socket.WaitFor("WATCHDOG=1", 5000));
  EXPECT_TRUE(socket.WaitFor("WATCHDOG=1", 5000));
  kill(node, SIGTERM);
  EXPECT_TRUE(socket.WaitFor("STOPPING=1", 10000));
  EXPECT_EQ(testing::WaitChild(node), 0);
}

// Under journald (stderr is the stream $JOURNAL_STREAM names) each line carries its syslog
// priority; anywhere else the lines are bare.
TEST(SystemdNotify, LogLinesCarryTheirPriorityOnTheJournalStream) {
  FakeRoot dir;
  std::string file = (dir.path() / "stderr").string();
  std::ofstream(file) << "";
  int fd = open(file.c_str(), O_RDONLY);
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0);
  std::string stream = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  auto env = [](std::string value) {
    return [value](const char* name) -> std::optional<std::string> {
      return std::string(name) == "JOURNAL_STREAM" ? std::optional<std::string>(value)
                                                   : std::nullopt;
    };
  };
  EXPECT_TRUE(IsJournalStream(fd, env(stream)));
  EXPECT_FALSE(IsJournalStream(fd, env(std::to_string(st.st_dev) + ":1")));
  EXPECT_FALSE(IsJournalStream(fd, env(stream + "x")));
  EXPECT_FALSE(IsJournalStream(fd, env("")));
  close(fd);

  // The real binary, stderr on that file: its lines while it connects and stops.
  DevPki pki = *DevPki::Create(std::time(nullptr));
  auto gateway = *DevGateway::Start(pki, {});
  std::string config_path = JoinedConfig(dir, *gateway);
  ASSERT_FALSE(config_path.empty());
  for (bool journal : {true, false}) {
    std::string log = (dir.path() / (journal ? "journal.log" : "plain.log")).string();
    std::ofstream(log) << "";
    ASSERT_EQ(stat(log.c_str(), &st), 0);
    if (journal) {
      setenv("JOURNAL_STREAM",
             (std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino)).c_str(), 1);
    }
    pid_t node = testing::SpawnChild(
        {"sh", "-c",
         "exec " + std::string(BCD_BINARY) + " node --config " + config_path + " 2>>" + log});
    unsetenv("JOURNAL_STREAM");
    ASSERT_TRUE(gateway->WaitForWelcomes(journal ? 1 : 2, std::chrono::seconds(20)));
    kill(node, SIGTERM);
    EXPECT_EQ(testing::WaitChild(node), 0);
    std::ifstream in(log);
    std::string line;
    int lines = 0;
    while (std::getline(in, line)) {
      ++lines;
      EXPECT_EQ(line.starts_with("<6>level=info ") || line.starts_with("<4>level=warn ") ||
                    line.starts_with("<3>level=error "),
                journal)
          << line;
    }
    EXPECT_GT(lines, 0);
  }
}

}  // namespace
}  // namespace bcd
