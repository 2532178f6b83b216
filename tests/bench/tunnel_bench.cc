// Prints the tunnel figures of quality.md: throughput of a `tcp` tunnel through the dev gateway and
// a real `bcd node` process (gRPC over mTLS on loopback), side by side in one run with the same
// transfer over no tunnel and over OpenSSH's `ssh -L` (Debian's sshd on a loopback port); the
// RSS of bcd while 16 tunnels run at full speed; and `openssl speed -evp aes-256-gcm` of one core.
//
//   build/tests/bench/tunnel_bench [MiB per transfer = 1024] [MiB per tunnel of 16 = 128]
//                                  [rounds of the 16-tunnel load = 1] [bcd binary = this build's]
//
// Each round of the 16-tunnel load prints bcd's peak RSS; at the end, how many sessions the node
// had (one: tunnel load never ended the session).
//
// Each transfer writes into a loopback sink that discards what it reads; a transfer ends when
// the sink has seen every byte and the end of the stream.

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "testing/child_process.h"
#include "testing/dev_gateway.h"

namespace {

namespace v1 = bettercompute::agent::v1;
using bcd::testing::DevGateway;
using bcd::testing::DevPki;
using bcd::testing::SpawnChild;
using bcd::testing::WaitChild;
using Clock = std::chrono::steady_clock;

// Accepts connections and discards what they send; counts finished streams.
class Sink {
 public:
  Sink() {
    fd_ = bcd::testing::ListenOnLoopback(&port_);
    thread_ = std::thread([this] {
      while (true) {
        int client = accept(fd_, nullptr, nullptr);
        if (client < 0) return;
        std::thread([this, client] {
          std::vector<char> buffer(256 * 1024);
          while (read(client, buffer.data(), buffer.size()) > 0) {
          }
          close(client);
          std::lock_guard<std::mutex> lock(mu_);
          ++finished_;
          cv_.notify_all();
        }).detach();
      }
    });
  }
  ~Sink() {
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }
  uint16_t port() const { return port_; }
  void WaitFinished(int count) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return finished_ >= count; });
  }

 private:
  int fd_;
  uint16_t port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  int finished_ = 0;
};

// Writes `bytes` to a socket, half-closes it; MB/s once the sink has seen it all.
double OverSocket(int fd, uint64_t bytes, Sink& sink, int finished) {
  std::vector<char> chunk(256 * 1024, 'x');
  auto start = Clock::now();
  for (uint64_t sent = 0; sent < bytes;) {
    ssize_t n = write(fd, chunk.data(), std::min<uint64_t>(chunk.size(), bytes - sent));
    if (n <= 0) return -1;
    sent += static_cast<uint64_t>(n);
  }
  shutdown(fd, SHUT_WR);
  sink.WaitFinished(finished);
  close(fd);
  return static_cast<double>(bytes) / 1e6 /
         std::chrono::duration<double>(Clock::now() - start).count();
}

// The same through a tunnel: the operator's data frames of 32 KiB, then end of input.
double OverTunnel(bcd::testing::DevTunnel& tunnel, uint64_t bytes, Sink* sink, int finished) {
  std::string chunk(32 * 1024, 'x');
  auto start = Clock::now();
  for (uint64_t sent = 0; sent < bytes; sent += chunk.size()) {
    if (!tunnel.Send(0, chunk)) return -1;
  }
  tunnel.Send(0, "");
  if (sink != nullptr) sink->WaitFinished(finished);
  return static_cast<double>(bytes) / 1e6 /
         std::chrono::duration<double>(Clock::now() - start).count();
}

long RssKiB(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return 0;
}

std::string Run(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char buffer[4096];
  while (std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) out.append(buffer, n);
  pclose(pipe);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1024;
  uint64_t each_mib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 128;
  int rounds = argc > 3 ? std::atoi(argv[3]) : 1;
  uint64_t bytes = mib << 20;
  signal(SIGPIPE, SIG_IGN);
  std::string bcd = argc > 4 ? argv[4] : BCD_BINARY;
  std::string pattern = "/tmp/bcd-tunnel-bench-XXXXXX";
  std::string dir = mkdtemp(pattern.data());
  DevPki pki = *DevPki::Create(std::time(nullptr));
  auto gateway = *DevGateway::Start(pki, {});
  std::string config = dir + "/config.toml";
  std::ofstream(config) << gateway->ConfigToml(dir + "/state") << "log_level = \"warn\"\n";
  if (WaitChild(SpawnChild(
          {bcd, "join", "--config", config, "--token", gateway->AddJoinToken("bench")})) != 0) {
    return 1;
  }
  pid_t node = SpawnChild({bcd, "node", "--config", config});
  if (!gateway->WaitForWelcomes(1, std::chrono::seconds(30))) return 1;
  v1::NodeSpec spec;
  spec.set_node_id("bench");
  spec.set_generation(1);
  *spec.mutable_access() = gateway->TunnelAccess();
  v1::ServerFrame frame;
  *frame.mutable_desired_state() = pki.SignSpec(spec);
  gateway->Push("bench", frame);
  gateway->WaitForReceived("bench", 3, std::chrono::seconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));

  Sink sink;
  int finished = 0;
  std::printf("tcp tunnel throughput, %llu MiB each, loopback, one run:\n",
              static_cast<unsigned long long>(mib));
  double direct = OverSocket(bcd::testing::ConnectLoopback(sink.port()), bytes, sink, ++finished);
  std::printf("  no tunnel                      %8.1f MB/s\n", direct);

  bcd::testing::DevTunnel tunnel =
      gateway->OpenTunnel("bench", {.op = "tcp", .host = "127.0.0.1", .port = sink.port()});
  if (!tunnel.WaitOpened(std::chrono::seconds(10))) {
    std::fprintf(stderr, "the tunnel did not open\n");
    return 1;
  }
  double tunneled = OverTunnel(tunnel, bytes, &sink, ++finished);
  std::printf("  bcd tcp tunnel (gRPC, mTLS)    %8.1f MB/s  (x%.2f of no tunnel)\n", tunneled,
              tunneled / direct);

  // OpenSSH port forwarding to the same sink, when sshd is installed.
  double ssh = -1;
  if (std::filesystem::exists("/usr/sbin/sshd")) {
    Run("ssh-keygen -q -t ed25519 -N '' -f " + dir + "/host && ssh-keygen -q -t ed25519 -N '' -f " +
        dir + "/user && cp " + dir + "/user.pub " + dir + "/authorized_keys && mkdir -p /run/sshd");
    int ssh_port = bcd::testing::FreeLoopbackPort();
    int local_port = bcd::testing::FreeLoopbackPort();
    pid_t sshd = SpawnChild({"/usr/sbin/sshd", "-D", "-e", "-p", std::to_string(ssh_port), "-h",
                             dir + "/host", "-o", "ListenAddress=127.0.0.1", "-o",
                             "AuthorizedKeysFile=" + dir + "/authorized_keys", "-o",
                             "StrictModes=no", "-o", "PidFile=" + dir + "/sshd.pid", "-o",
                             "AllowTcpForwarding=yes", "-o", "PermitRootLogin=prohibit-password"});
    bcd::testing::WaitForLoopbackPort(static_cast<uint16_t>(ssh_port));
    pid_t client = SpawnChild(
        {"ssh", "-N", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o",
         "LogLevel=ERROR", "-i", dir + "/user", "-p", std::to_string(ssh_port), "-L",
         std::to_string(local_port) + ":127.0.0.1:" + std::to_string(sink.port()),
         std::string(getenv("USER") ? getenv("USER") : "root") + "@127.0.0.1"});
    if (bcd::testing::WaitForLoopbackPort(static_cast<uint16_t>(local_port))) {
      ++finished;  // the probe connection of WaitForPort
      sink.WaitFinished(finished);
      ssh = OverSocket(bcd::testing::ConnectLoopback(static_cast<uint16_t>(local_port)), bytes,
                       sink, ++finished);
      std::printf("  ssh -L (OpenSSH, %s)   %8.1f MB/s  (bcd x%.2f of ssh)\n",
                  Run("ssh -V 2>&1 | cut -d, -f1 | tr -d '\\n'").c_str(), ssh, tunneled / ssh);
    } else {
      std::printf("  ssh -L: the forward did not come up\n");
    }
    kill(client, SIGTERM);
    WaitChild(client);
    kill(sshd, SIGTERM);
    WaitChild(sshd);
  } else {
    std::printf("  ssh -L: not measured (/usr/sbin/sshd is not installed)\n");
  }

  std::string speed = Run("openssl speed -evp aes-256-gcm -seconds 2 -bytes 16384 2>/dev/null");
  std::istringstream lines(speed);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("AES-256-GCM", 0) == 0) {
      std::istringstream fields(line);
      std::string name, value;
      fields >> name >> value;
      double kbs = std::stod(value.substr(0, value.find('k')));
      std::printf("  openssl speed aes-256-gcm, 16 KiB blocks, one core: %.1f MB/s (bcd x%.2f)\n",
                  kbs / 1000, tunneled / (kbs / 1000));
    }
  }

  // 16 tunnels at once, at full speed: bcd's RSS while they run and after.
  for (int round = 1; round <= rounds; ++round) {
    long rss_before = RssKiB(node);
    std::atomic<bool> running{true};
    long rss_max = 0;
    std::thread sampler([&] {
      while (running) {
        rss_max = std::max(rss_max, RssKiB(node));
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
    std::vector<bcd::testing::DevTunnel> tunnels;
    int opened = 0;  // each opened tunnel's connection to the sink ends, whatever happens to it
    for (int i = 0; i < 16; ++i) {
      tunnels.push_back(
          gateway->OpenTunnel("bench", {.op = "tcp", .host = "127.0.0.1", .port = sink.port()}));
      opened += tunnels.back().WaitOpened(std::chrono::seconds(10));
    }
    auto start = Clock::now();
    std::vector<std::thread> senders;
    std::atomic<int> failed{0};
    for (auto& t : tunnels) {
      senders.emplace_back([&t, each_mib, &failed] {
        if (OverTunnel(t, each_mib << 20, nullptr, 0) < 0) ++failed;
      });
    }
    for (auto& s : senders) s.join();
    finished += opened;
    sink.WaitFinished(finished);
    double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    running = false;
    sampler.join();
    std::printf(
        "16 tunnels at once, %llu MiB each (round %d): %.1f MB/s in all, %d failed; bcd RSS %ld "
        "KiB before, %ld KiB at most while they ran, %ld KiB after\n",
        static_cast<unsigned long long>(each_mib), round,
        static_cast<double>((16 - failed) * (each_mib << 20)) / 1e6 / seconds, failed.load(),
        rss_before, rss_max, RssKiB(node));
    std::fflush(stdout);
  }
  std::size_t sessions = gateway->SessionNodes().size();
  std::printf("sessions of the node: %zu (%s)\n", sessions,
              sessions == 1 ? "tunnel load never ended it" : "the session was lost and redialed");
  kill(node, SIGTERM);
  WaitChild(node);
  std::filesystem::remove_all(dir);
  return sessions == 1 ? 0 : 1;
}
