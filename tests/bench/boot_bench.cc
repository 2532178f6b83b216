// Prints the boot server's figures, measured side by side in one run: per-MAC iPXE scripts served
// per second and kernel bytes per second by bcd's boot server and by Debian's nginx serving the
// same bytes as static files (the same client: C concurrent connections, one request each, as
// iPXE makes them); and, with --vm, the time from boot.prepareRamdisk sent by the dev gateway to
// the first kernel request of a QEMU machine PXE-booting from the site agent (the machine is
// powered on when the command succeeds, as a control plane would through the BMC).
//
//   build/tests/bench/boot_bench [seconds=5] [connections=8] [--vm]

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "bettercompute/site/v1/site.pb.h"
#include "daemon/agent.h"
#include "daemon/identity/join.h"
#include "fmt/format.h"
#include "modes/site/boot_entries.h"
#include "modes/site/boot_server.h"
#include "modes/site/site_mode.h"
#include "pki/envelope.h"
#include "pki/keys.h"
#include "testing/child_process.h"
#include "testing/dev_gateway.h"
#include "testing/metal.h"
#include "testing/nginx.h"

namespace {

namespace v1 = bettercompute::agent::v1;
namespace site = bettercompute::site::v1;
using Clock = std::chrono::steady_clock;

constexpr char kMac[] = "52:54:00:12:34:56";

// One GET on a new connection; the bytes of the answer (0 on failure).
std::size_t Fetch(uint16_t port, const std::string& path) {
  int fd = bcd::testing::ConnectLoopback(port);
  if (fd < 0) return 0;
  std::string request =
      fmt::format("GET {} HTTP/1.1\r\nHost: boot\r\nConnection: close\r\n\r\n", path);
  if (!bcd::testing::SendAll(fd, request)) {
    close(fd);
    return 0;
  }
  std::size_t total = 0;
  std::vector<char> buffer(256 * 1024);
  for (ssize_t n; (n = read(fd, buffer.data(), buffer.size())) > 0;)
    total += static_cast<std::size_t>(n);
  close(fd);
  return total;
}

struct Rate {
  double requests_per_second = 0, megabytes_per_second = 0;
};

// `connections` threads fetching `path` for `seconds`.
Rate Load(uint16_t port, const std::string& path, int connections, double seconds) {
  std::atomic<uint64_t> requests{0}, bytes{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  auto start = Clock::now();
  for (int i = 0; i < connections; ++i) {
    threads.emplace_back([&] {
      while (!stop) {
        std::size_t n = Fetch(port, path);
        if (n == 0) continue;
        requests += 1;
        bytes += n;
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : threads) t.join();
  double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  return {static_cast<double>(requests) / elapsed, static_cast<double>(bytes) / elapsed / 1e6};
}

// From boot.prepareRamdisk sent to the machine's first kernel request, through the whole site
// agent: the dev gateway, the command, the download into the cache, the VM's firmware.
int VmFigure(const std::filesystem::path& dir, const bcd::testing::BootImages& images,
             const bcd::testing::Nginx& nginx) {
  bcd::testing::DevPki pki = *bcd::testing::DevPki::Create(std::time(nullptr));
  auto gateway = *bcd::testing::DevGateway::Start(pki, {});
  int port = bcd::testing::FreeLoopbackPort();
  std::string toml =
      gateway->ConfigToml(dir / "state") +
      fmt::format("[boot]\nlisten = \"127.0.0.1:{}\"\nurl = \"http://10.0.2.2:{}\"\n", port, port);
  bcd::Config config = *bcd::Config::Parse(toml, "bench.toml");
  auto now = [] { return static_cast<int64_t>(std::time(nullptr)); };
  if (!bcd::JoinFleet(config, {.evidence = gateway->AddJoinToken("site-1"),
                               .now = now,
                               .sleep = [](std::chrono::seconds) {}})
           .ok()) {
    return 1;
  }
  std::ostringstream sink;
  bcd::Logger log(&sink, bcd::LogLevel::kInfo);
  auto daemon = *bcd::Agent::Create(config, std::make_unique<bcd::SiteMode>(),
                                    {.now = now, .uniform01 = [] { return 0.5; }, .log = &log});
  std::thread runner([&] { (void)daemon->Run(); });
  gateway->WaitForReceived("site-1", 1, std::chrono::seconds(30));
  gateway->AddSecret("boot/vm", "vm-token-0123456789abcdef", {"wf", "step", ""});

  site::PrepareRamdiskPayload entry;
  entry.set_mac(kMac);
  entry.set_boot_entry_id("be-bench");
  entry.set_kernel_url(nginx.url() + "/vmlinuz");
  entry.set_initrd_url(nginx.url() + "/initrd.gz");
  entry.set_kernel_sha256(images.kernel_sha256);
  entry.set_initrd_sha256(images.initrd_sha256);
  entry.set_cmdline("console=ttyS0 panic=-1");
  entry.set_discovery_token_ref("boot/vm");
  entry.set_expires_at(static_cast<uint64_t>(now() + 600));
  v1::Command command =
      bcd::testing::DevPki::MakeCommand("prepare", "site-1", "boot.prepareRamdisk", now());
  command.set_workflow_id("wf");
  command.set_step_id("step");
  command.set_payload(entry.SerializeAsString());
  v1::ServerFrame frame;
  *frame.mutable_command() = pki.SignCommand(command);
  auto start = Clock::now();
  gateway->Push("site-1", frame);
  double prepared_ms = -1;
  while (Clock::now() - start < std::chrono::seconds(60) && prepared_ms < 0) {
    for (const auto& f : gateway->Received("site-1")) {
      if (f.has_command_update() && f.command_update().command_id() == "prepare" &&
          f.command_update().state() == v1::COMMAND_STATE_SUCCEEDED) {
        prepared_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      }
    }
    gateway->WaitForReceived("site-1", gateway->Received("site-1").size() + 1,
                             std::chrono::milliseconds(5));
  }
  double first_kernel_ms = -1;
  std::thread vm([&] {
    (void)bcd::testing::PxeBootVm({.mac = kMac,
                                   .bootfile = fmt::format("http://10.0.2.2:{}/boot.ipxe", port),
                                   .console = dir / "console.log",
                                   .limit = std::chrono::seconds(120)});
  });
  while (Clock::now() - start < std::chrono::seconds(120) && first_kernel_ms < 0) {
    if (sink.str().find("what=kernel") != std::string::npos)  // read racily: a poll, no more
      first_kernel_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  vm.join();
  daemon->Stop();
  runner.join();
  std::printf("boot.prepareRamdisk (download into the cache included): %.0f ms\n", prepared_ms);
  std::printf("prepareRamdisk sent to the VM's first kernel request: %.0f ms\n", first_kernel_ms);
  return prepared_ms < 0 || first_kernel_ms < 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = argc > 1 && argv[1][0] != '-' ? std::atof(argv[1]) : 5;
  int connections = argc > 2 && argv[2][0] != '-' ? std::atoi(argv[2]) : 8;
  bool vm = argc > 1 && std::string(argv[argc - 1]) == "--vm";
  std::string pattern = "/tmp/bcd-boot-bench-XXXXXX";
  std::filesystem::path dir = mkdtemp(pattern.data());

  absl::StatusOr<bcd::testing::BootImages> images = bcd::testing::MakeBootImages(dir / "www");
  if (!images.ok()) {
    std::fprintf(stderr, "%s\n", std::string(images.status().message()).c_str());
    return 1;
  }
  std::ostringstream sink;
  bcd::Logger log(&sink, bcd::LogLevel::kWarn);  // the access log off, as nginx's is
  auto now = [] { return static_cast<int64_t>(std::time(nullptr)); };
  auto entries = *bcd::BootEntries::Open(dir / "boot", now);
  std::filesystem::create_directories(dir / "boot" / "cache");
  std::filesystem::copy_file(images->kernel,
                             dir / "boot" / "cache" / bcd::pki::Hex(images->kernel_sha256));
  (void)entries->Put({.mac = kMac,
                      .id = "be-1",
                      .workflow_id = "wf",
                      .kernel_url = "http://images/vmlinuz",
                      .initrd_url = "http://images/initrd.gz",
                      .cmdline = "console=ttyS0",
                      .kernel_sha256 = images->kernel_sha256,
                      .expires_at = now() + 3600,
                      .token = "tok-0123456789abcdef"});
  bcd::pki::PrivateKey key = *bcd::pki::PrivateKey::Generate();
  auto server = *bcd::BootServer::Start(
      {.listen = {"127.0.0.1", 0},
       .url = "http://10.0.2.2:8080",
       .site = "bench",
       .entries = entries.get(),
       .cache_dir = dir / "boot" / "cache",
       .sign = [&](std::string_view input) { return bcd::pki::Sign(input, key, "bench"); },
       .now = now},
      &log);
  // nginx serves the same script (as bcd writes it) and the same kernel as static files.
  std::string script_path = "/boot/52-54-00-12-34-56.ipxe";
  std::string script;
  {
    int fd = bcd::testing::ConnectLoopback(server->port());
    std::string raw =
        bcd::testing::Converse(fd, fmt::format("GET {} HTTP/1.1\r\nHost: b\r\n\r\n", script_path));
    script = raw.substr(raw.find("\r\n\r\n") + 4);
  }
  std::filesystem::create_directories(dir / "www" / "boot" / "52-54-00-12-34-56");
  std::ofstream(dir / "www" / script_path.substr(1)) << script;
  std::filesystem::copy_file(images->kernel, dir / "www" / "boot" / "52-54-00-12-34-56" / "kernel");
  auto nginx = *bcd::testing::Nginx::Start(dir / "nginx", {.root = dir / "www"});

  std::printf(
      "boot_bench: %.0f s per figure, %d connections, a request per connection, kernel %.1f MB\n",
      seconds, connections, static_cast<double>(std::filesystem::file_size(images->kernel)) / 1e6);
  // Side by side, alternating, twice each: the median of two is their mean.
  Rate bcd_scripts[2], nginx_scripts[2], bcd_kernel[2], nginx_kernel[2];
  for (int round = 0; round < 2; ++round) {
    bcd_scripts[round] = Load(server->port(), script_path, connections, seconds);
    nginx_scripts[round] =
        Load(static_cast<uint16_t>(nginx->port()), script_path, connections, seconds);
    bcd_kernel[round] =
        Load(server->port(), "/boot/52-54-00-12-34-56/kernel", connections, seconds);
    nginx_kernel[round] = Load(static_cast<uint16_t>(nginx->port()),
                               "/boot/52-54-00-12-34-56/kernel", connections, seconds);
  }
  auto mean = [](const Rate r[2], bool mb) {
    return mb ? (r[0].megabytes_per_second + r[1].megabytes_per_second) / 2
              : (r[0].requests_per_second + r[1].requests_per_second) / 2;
  };
  double bs = mean(bcd_scripts, false), ns = mean(nginx_scripts, false);
  double bk = mean(bcd_kernel, true), nk = mean(nginx_kernel, true);
  std::printf("iPXE scripts/s: bcd %.0f, nginx %.0f (ratio %.2f)\n", bs, ns, bs / ns);
  std::printf("kernel MB/s:    bcd %.0f, nginx %.0f (ratio %.2f)\n", bk, nk, bk / nk);
  server.reset();
  int rc = 0;
  if (vm) rc = VmFigure(dir / "vm", *images, *nginx);
  std::filesystem::remove_all(dir);
  return rc;
}
