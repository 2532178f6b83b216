// bcd-dev: the dev stack from a shell.
//
//   bcd-dev up [--dir DIR] [--seconds N] [--protocol MIN..MAX] [--bcd PATH] [--websocket] [--site]
//   bcd-dev run KIND [JSON] [--dir DIR]
//   bcd-dev spec JSON [--dir DIR]
//   bcd-dev secret REF VALUE (--step WORKFLOW/STEP | --allocation ID | --host SECTION/FIELD)
//                 [--dir DIR]
//   bcd-dev exec [--dir DIR] -- CMD [ARG...]
//   bcd-dev shell [--dir DIR]
//   bcd-dev forward [--dir DIR] LOCAL_PORT:[HOST:]PORT
//   bcd-dev upgrade PATH --version V [--os-arch A] [--dir DIR]
//
// `up` starts the dev gateway on loopback with a fresh dev PKI, joins a `bcd node` to it with a
// one-time token, hands it the dev approver set, runs the node in the foreground (its log lines on
// stderr) and prints what the gateway sees, until Ctrl-C or N seconds; then stops the node with
// SIGTERM and prints `bcd status`. While it runs, `run` signs a command of KIND with the JSON
// payload (approved by the dev approvers when the kind needs a quorum), sends it to the node and
// prints its updates and result; `spec` signs and sends desired state and prints the SpecAck.
// `secret` puts a secret in the dev broker, bound as given. All three find the running stack
// through DIR/dev.sock; DIR defaults to the last `up`'s. `exec`, `shell` and `forward` are the
// operator's side of a tunnel through the gateway: exec runs CMD on the node (stdin forwarded,
// stdout and stderr apart, its exit code ours), shell is an interactive login shell on a PTY
// (resizes follow the terminal), forward listens on 127.0.0.1:LOCAL_PORT and carries each
// connection to HOST:PORT as the node sees it (HOST defaults to 127.0.0.1). With --websocket the
// node joins over gRPC and then runs over the gateway's WebSocket listener (signed intent only,
// renewals over HTTPS). The node runs a copy of bcd installed in DIR/bin, with the dev release
// key pinned; `upgrade` puts the binary at PATH on the stack's HTTPS release server, signs it as
// version V for this machine's os/arch (or A) and sends daemon.upgrade, printing the result the
// node reports after its restart. With --site, up runs `bcd site` (dev-site-1) instead, with a
// Redfish BMC emulator and Debian's ipmi_sim to drive (bmc.* kinds; the credential is the secret
// bmc/dev, bound to the step every dev command runs as: workflow "dev", step "dev") and a boot
// server ([boot] on 127.0.0.1, named to machines as 10.0.2.2, QEMU's user network's view of the
// host): up builds a kernel and a busybox ramdisk to boot, puts them on the release server and
// prints the boot.prepareRamdisk that pins them and the QEMU line that PXE-boots them (the
// discovery token is the secret boot/dev).

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "base/files.h"
#include "base/version.h"
#include "config/config.h"
#include "daemon/upgrade/release.h"
#include "google/protobuf/util/json_util.h"
#include "install/install_script.h"
#include "nlohmann/json.hpp"
#include "pki/keys.h"
#include "sys/utsname.h"
#include "testing/bmc_emulators.h"
#include "testing/child_process.h"
#include "testing/dev_control.h"
#include "testing/dev_gateway.h"
#include "testing/metal.h"
#include "testing/release_server.h"
#include "transport/tls.h"

namespace {

using bcd::testing::DevGateway;
using bcd::testing::DevPki;
using bcd::testing::SpawnChild;
using bcd::testing::WaitChild;

constexpr char kUsage[] =
    "Usage: bcd-dev COMMAND [options]\n"
    "  bcd-dev up [--dir DIR] [--seconds N] [--protocol MIN..MAX] [--bcd PATH] [--websocket]\n"
    "             [--site]\n"
    "  bcd-dev run KIND [JSON] [--dir DIR]\n"
    "  bcd-dev spec JSON [--dir DIR]\n"
    "  bcd-dev secret REF VALUE (--step WORKFLOW/STEP | --allocation ID |\n"
    "                            --host SECTION/FIELD) [--dir DIR]\n"
    "  bcd-dev exec [--dir DIR] -- CMD [ARG...]\n"
    "  bcd-dev shell [--dir DIR]\n"
    "  bcd-dev forward [--dir DIR] LOCAL_PORT:[HOST:]PORT\n"
    "  bcd-dev install-script [--node ID] [--role node|site] [--bcd PATH] [--dir DIR]\n"
    "  bcd-dev upgrade PATH --version V [--os-arch A] [--dir DIR]\n"
    "\n"
    "The dev stack for trying bcd and for its tests: a dev PKI and gateway on loopback, a node\n"
    "joined to it and running, and an operator's commands against it.\n"
    "\n"
    "Commands:\n"
    "  up              start the stack (gateway, bcd join, bcd node) until SIGINT or --seconds\n"
    "  run             send a signed command of KIND with a JSON payload; print its result\n"
    "  spec            push a signed desired state (JSON) and print the node's answer\n"
    "  secret          add a secret to the dev broker, bound to a step, allocation or section\n"
    "  exec            run a command on the node through an exec tunnel\n"
    "  shell           open a shell on the node through a shell tunnel\n"
    "  forward         forward a local port to an address the node reaches (tcp tunnel)\n"
    "  install-script  print the installer a new machine would run against this stack\n"
    "  upgrade         serve PATH as release V, signed by the dev release key, and send\n"
    "                  daemon.upgrade; print the result the node reports after its restart\n"
    "\n"
    "Options:\n"
    "  --dir DIR       the stack's directory (up prints it; the others default to the last up)\n"
    "  --site          up: run a site agent (bcd site) with a Redfish and an IPMI BMC to drive\n"
    "                  and a boot server a QEMU machine can PXE-boot from\n"
    "  --help          print this help\n"
    "  --version       print the version\n";

int Usage() {
  std::fputs(kUsage, stderr);
  return 2;
}

// Where `up` records its directory for `run` and `spec`: in the user's runtime dir, else in their
// state dir (~/.local/state): never a name in /tmp that another user could take first.
std::filesystem::path CurrentFile() {
  auto env = [](const char* name) -> std::string {
    const char* value = std::getenv(name);
    return value != nullptr ? value : "";
  };
  if (!env("XDG_RUNTIME_DIR").empty())
    return std::filesystem::path(env("XDG_RUNTIME_DIR")) / "bcd-dev.current";
  std::filesystem::path state = !env("XDG_STATE_HOME").empty()
                                    ? std::filesystem::path(env("XDG_STATE_HOME"))
                                    : std::filesystem::path(env("HOME")) / ".local/state";
  return state / "bcd-dev" / "current";
}

// DIR from --dir, else the one the last `up` recorded; "" (and a message) when there is none.
std::string StackDir(std::string dir) {
  if (dir.empty()) {
    std::ifstream current(CurrentFile());
    std::getline(current, dir);
    if (dir.empty()) {
      std::fprintf(stderr, "bcd-dev: no running stack found (%s); pass --dir DIR\n",
                   CurrentFile().c_str());
    }
  }
  return dir;
}

// One request to the stack in `dir`: the answer, or nullopt after saying on stderr what went wrong.
std::optional<nlohmann::json> AskStack(const std::string& dir, const nlohmann::json& request) {
  absl::StatusOr<std::string> answer =
      bcd::testing::AskDevControl(std::filesystem::path(dir) / "dev.sock", request.dump());
  if (!answer.ok()) {
    std::fprintf(stderr, "bcd-dev: %s\n", std::string(answer.status().message()).c_str());
    return std::nullopt;
  }
  nlohmann::json reply = nlohmann::json::parse(*answer, nullptr, false);
  if (!reply.is_object() || !reply.value("ok", false)) {
    std::string error = reply.is_object() ? reply.value("error", *answer) : *answer;
    std::fprintf(stderr, "bcd-dev: %s\n", error.c_str());
    return std::nullopt;
  }
  return reply["answer"];
}

// bcd-dev run / spec: one request to the running stack; exit 0 when the command succeeded or the
// spec was applied.
int Ask(const std::vector<std::string>& args) {
  std::vector<std::string> positional;
  std::string dir;
  nlohmann::json binding = nlohmann::json::object();
  for (std::size_t i = 1; i < args.size(); ++i) {
    bool takes_value = args[i] == "--dir" || args[i] == "--step" || args[i] == "--allocation" ||
                       args[i] == "--host";
    if (takes_value && i + 1 >= args.size()) return Usage();
    if (args[i] == "--dir") {
      dir = args[++i];
    } else if (args[i] == "--step" || args[i] == "--host") {
      const std::string& value = args[++i];
      std::size_t slash = value.find('/');
      if (slash == std::string::npos) return Usage();
      binding["workflow_id"] = (args[i - 1] == "--host" ? "host:" : "") + value.substr(0, slash);
      binding["step_id"] = value.substr(slash + 1);
    } else if (args[i] == "--allocation") {
      binding["allocation_id"] = args[++i];
    } else {
      positional.push_back(args[i]);
    }
  }
  nlohmann::json request;
  if (args[0] == "run" && (positional.size() == 1 || positional.size() == 2)) {
    request = {{"op", "run"}, {"kind", positional[0]}};
    if (positional.size() == 2) {
      request["payload"] = nlohmann::json::parse(positional[1], nullptr, false);
      if (request["payload"].is_discarded())
        return std::fprintf(stderr, "bcd-dev: the payload is not JSON\n"), 2;
    }
  } else if (args[0] == "secret" && positional.size() == 2 && !binding.empty()) {
    request = binding;
    request["op"] = "secret";
    request["ref"] = positional[0];
    request["value"] = positional[1];
  } else if (args[0] == "spec" && positional.size() == 1) {
    request = {{"op", "spec"}, {"spec", nlohmann::json::parse(positional[0], nullptr, false)}};
    if (request["spec"].is_discarded())
      return std::fprintf(stderr, "bcd-dev: the spec is not JSON\n"), 2;
  } else {
    return Usage();
  }
  dir = StackDir(dir);
  if (dir.empty()) return 1;
  std::optional<nlohmann::json> outcome = AskStack(dir, request);
  if (!outcome) return 1;
  std::printf("%s\n", outcome->dump(2).c_str());
  bool good = outcome->value("state", "") == "COMMAND_STATE_SUCCEEDED" ||
              outcome->value("state", "") == "SPEC_ACK_STATE_APPLIED" ||
              outcome->value("bound", false);
  return good ? 0 : 1;
}

// bcd-dev install-script: the installer `bcd install-script` would print for a new machine of the
// running stack: its gateway and pin from the stack's config.toml, a one-time token for ID from
// the gateway, and this build's bcd as the binary (file://, with its sha256). Try it with
// `sh install.sh --root DIR`.
int InstallScript(const std::vector<std::string>& args) {
  std::string dir, node = "dev-node-2", role = "node", bcd = BCD_DEFAULT_BINARY;
  for (std::size_t i = 1; i < args.size(); ++i) {
    if (i + 1 >= args.size()) return Usage();
    if (args[i] == "--dir") {
      dir = args[++i];
    } else if (args[i] == "--node") {
      node = args[++i];
    } else if (args[i] == "--role") {
      role = args[++i];
    } else if (args[i] == "--bcd") {
      bcd = args[++i];
    } else {
      return Usage();
    }
  }
  dir = StackDir(dir);
  if (dir.empty()) return 1;
  absl::StatusOr<bcd::Config> config =
      bcd::Config::Load(std::filesystem::path(dir) / "config.toml");
  if (!config.ok()) {
    return std::fprintf(stderr, "bcd-dev: %s\n", std::string(config.status().message()).c_str()), 1;
  }
  std::optional<nlohmann::json> token = AskStack(dir, {{"op", "token"}, {"node", node}});
  if (!token) return 1;
  absl::StatusOr<std::string> binary = bcd::ReadWholeFile(bcd, std::size_t{1} << 30);
  if (!binary.ok()) {
    return std::fprintf(stderr, "bcd-dev: %s: %s\n", bcd.c_str(),
                        std::string(binary.status().message()).c_str()),
           1;
  }
  std::vector<std::string> flags = {"--gateway-url",
                                    config->gateway_url()->text(),
                                    "--gateway-server-name",
                                    config->GatewayServerName(),
                                    "--ca-pin",
                                    config->gateway_ca_spki_sha256()->Hex(),
                                    "--token",
                                    (*token)["token"],
                                    "--role",
                                    role,
                                    "--binary-url",
                                    "file://" + std::filesystem::absolute(bcd).string(),
                                    "--binary-sha256",
                                    bcd::pki::Hex(bcd::pki::Sha256(*binary))};
  if (config->websocket())
    flags.insert(flags.end(), {"--websocket-url", config->websocket()->url.text()});
  absl::StatusOr<bcd::install::InstallOptions> options = bcd::install::ParseInstallFlags(
      flags, [](const std::string& path) { return bcd::ReadWholeFile(path, 64 * 1024); });
  absl::StatusOr<std::string> script =
      options.ok() ? bcd::install::GenerateInstallScript(*options) : options.status();
  if (!script.ok()) {
    return std::fprintf(stderr, "bcd-dev: %s\n", std::string(script.status().message()).c_str()), 1;
  }
  std::fputs(script->c_str(), stdout);
  return 0;
}

volatile sig_atomic_t resized = 0;

// Relays one tunnel: `in` to channel 0 (EOF ends input), channel 0 to `out`, channel 1 to `err`.
// The exit code, or -1 when the tunnel did not open or broke.
int Relay(int fd, int in, int out, int err, bool tty) {
  char type = 0;
  std::string payload;
  if (!bcd::testing::ReadTunnelMessage(fd, &type, &payload) || type != 'O') {
    std::fprintf(stderr, "bcd-dev: %s\n", type == 'F' ? payload.c_str() : "no answer");
    return -1;
  }
  std::vector<char> buffer(32 * 1024);
  bool input = in >= 0;
  while (true) {
    if (tty && resized) {
      resized = 0;
      winsize size{};
      if (ioctl(in, TIOCGWINSZ, &size) == 0) {
        bcd::testing::WriteTunnelMessage(
            fd, 'r', std::to_string(size.ws_row) + " " + std::to_string(size.ws_col));
      }
    }
    pollfd polls[2] = {{fd, POLLIN, 0}, {input ? in : -1, POLLIN, 0}};
    if (poll(polls, 2, -1) < 0) continue;  // EINTR: a resize
    if (polls[0].revents != 0) {
      if (!bcd::testing::ReadTunnelMessage(fd, &type, &payload)) return -1;
      int to = type == 'D' ? out : type == 'E' ? err : -1;
      if (to >= 0) {
        for (std::size_t done = 0; done < payload.size();) {
          ssize_t n = write(to, payload.data() + done, payload.size() - done);
          if (n <= 0) break;
          done += static_cast<std::size_t>(n);
        }
      } else if (type == 'C') {
        nlohmann::json closed = nlohmann::json::parse(payload, nullptr, false);
        if (!closed.is_object()) return -1;
        std::string reason = closed.value("reason", "");
        if (!reason.empty()) std::fprintf(stderr, "bcd-dev: tunnel closed: %s\n", reason.c_str());
        return closed.value("exit_code", -1);
      }
    }
    if (input && polls[1].revents != 0) {
      ssize_t n = read(in, buffer.data(), buffer.size());
      if (n > 0) {
        bcd::testing::WriteTunnelMessage(fd, 'd', std::string_view(buffer.data(), n));
      } else {
        input = false;
        bcd::testing::WriteTunnelMessage(fd, 'e', "");
      }
    }
  }
}

// bcd-dev exec / shell / forward.
int TunnelCommand(const std::vector<std::string>& args) {
  std::string dir;
  std::vector<std::string> rest;
  std::size_t i = 1;
  for (; i < args.size(); ++i) {
    if (args[i] == "--dir" && i + 1 < args.size()) {
      dir = args[++i];
    } else if (args[i] == "--") {
      ++i;
      break;
    } else {
      rest.push_back(args[i]);
    }
  }
  for (; i < args.size(); ++i) rest.push_back(args[i]);
  dir = StackDir(dir);
  if (dir.empty()) return 1;
  std::filesystem::path socket = std::filesystem::path(dir) / "dev.sock";
  auto open = [&](const nlohmann::json& request) -> int {
    absl::StatusOr<int> fd = bcd::testing::ConnectDevControl(socket);
    if (!fd.ok()) {
      std::fprintf(stderr, "bcd-dev: %s\n", std::string(fd.status().message()).c_str());
      return -1;
    }
    bcd::testing::WriteTunnelMessage(*fd, 'o', request.dump());
    return *fd;
  };
  if (args[0] == "exec") {
    if (rest.empty()) return Usage();
    int fd = open({{"op", "exec"}, {"cmd", rest}});
    if (fd < 0) return 1;
    int code = Relay(fd, 0, 1, 2, false);
    std::fflush(stdout);
    _exit(code < 0 ? 1 : code);  // stdin may still be blocked in a read
  }
  if (args[0] == "shell") {
    winsize size{24, 80, 0, 0};
    bool tty = isatty(0) == 1;
    if (tty) ioctl(0, TIOCGWINSZ, &size);
    int fd = open({{"op", "shell"}, {"rows", size.ws_row}, {"cols", size.ws_col}});
    if (fd < 0) return 1;
    termios saved{};
    if (tty) {
      tcgetattr(0, &saved);
      termios raw = saved;
      cfmakeraw(&raw);
      tcsetattr(0, TCSANOW, &raw);
      struct sigaction action {};
      action.sa_handler = [](int) { resized = 1; };
      sigaction(SIGWINCH, &action, nullptr);
    }
    int code = Relay(fd, 0, 1, 1, tty);
    if (tty) tcsetattr(0, TCSANOW, &saved);
    return code < 0 ? 1 : code;
  }
  // forward LOCAL_PORT:[HOST:]PORT
  if (rest.size() != 1) return Usage();
  std::string spec = rest[0];
  std::size_t colon = spec.find(':'), last = spec.rfind(':');
  if (colon == std::string::npos) return Usage();
  int local = std::atoi(spec.substr(0, colon).c_str());
  std::string host = colon == last ? "127.0.0.1" : spec.substr(colon + 1, last - colon - 1);
  int port = std::atoi(spec.substr(last + 1).c_str());
  if (local <= 0 || local > 65535 || port <= 0 || port > 65535) return Usage();
  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(local));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      listen(listener, 16) != 0) {
    return std::fprintf(stderr, "bcd-dev: cannot listen on 127.0.0.1:%d: %s\n", local,
                        std::strerror(errno)),
           1;
  }
  std::printf("forwarding 127.0.0.1:%d to %s:%d on the node (Ctrl-C stops)\n", local, host.c_str(),
              port);
  std::fflush(stdout);
  signal(SIGPIPE, SIG_IGN);
  while (true) {
    int client = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    std::thread([=] {
      int fd = open({{"op", "tcp"}, {"host", host}, {"port", port}});
      if (fd >= 0) {
        Relay(fd, client, client, -1, false);
        close(fd);
      }
      close(client);
    }).detach();
  }
}

// bcd-dev upgrade: the release at PATH served by the stack, signed, and sent as daemon.upgrade.
int Upgrade(const std::vector<std::string>& args) {
  std::string dir, path, version, os_arch;
  for (std::size_t i = 1; i < args.size(); ++i) {
    bool takes_value = args[i] == "--dir" || args[i] == "--version" || args[i] == "--os-arch";
    if (takes_value && i + 1 >= args.size()) return Usage();
    if (args[i] == "--dir") {
      dir = args[++i];
    } else if (args[i] == "--version") {
      version = args[++i];
    } else if (args[i] == "--os-arch") {
      os_arch = args[++i];
    } else if (path.empty()) {
      path = args[i];
    } else {
      return Usage();
    }
  }
  if (path.empty() || version.empty()) return Usage();
  if (os_arch.empty()) {
    utsname uts{};
    uname(&uts);
    os_arch = bcd::upgrade::OsArch(uts.machine);
  }
  dir = StackDir(dir);
  if (dir.empty()) return 1;
  auto fail = [](const std::string& what) {
    return std::fprintf(stderr, "bcd-dev: %s\n", what.c_str()), 1;
  };
  absl::StatusOr<std::string> binary = bcd::ReadWholeFile(path, std::size_t{1} << 30);
  if (!binary.ok()) return fail(path + ": " + std::string(binary.status().message()));
  absl::StatusOr<std::string> key_pem = bcd::ReadWholeFile(dir + "/release-key.pem", 64 * 1024);
  absl::StatusOr<std::string> base = bcd::ReadWholeFile(dir + "/release-server", 1024);
  if (!key_pem.ok() || !base.ok())
    return fail("this stack has no release server (an older bcd-dev up?)");
  absl::StatusOr<bcd::pki::PrivateKey> key = bcd::pki::PrivateKey::FromPem(*key_pem);
  if (!key.ok()) return fail(std::string(key.status().message()));
  std::string name = "bcd-" + version;
  if (absl::Status s = bcd::AtomicWriteFile(dir + "/releases/" + name, *binary, 0644); !s.ok())
    return fail(std::string(s.message()));
  std::string url = base->substr(0, base->find('\n')) + "/" + name;
  bettercompute::agent::v1::DaemonUpgradePayload payload =
      DevPki::SignRelease(*key, version, os_arch, *binary, url);
  std::string payload_json;
  (void)google::protobuf::util::MessageToJsonString(payload, &payload_json);
  std::printf("release %s for %s at %s, sha256 %s\n", version.c_str(), os_arch.c_str(), url.c_str(),
              bcd::pki::Hex(payload.sha256()).c_str());
  std::fflush(stdout);
  std::optional<nlohmann::json> outcome =
      AskStack(dir, {{"op", "run"},
                     {"kind", "daemon.upgrade"},
                     {"payload", nlohmann::json::parse(payload_json)}});
  if (!outcome) return 1;
  std::printf("%s\n", outcome->dump(2).c_str());
  return outcome->value("state", "") == "COMMAND_STATE_SUCCEEDED" ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 1 && (args[0] == "--help" || args[0] == "-h" || args[0] == "help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (args.size() == 1 && args[0] == "--version") {
    std::printf("bcd-dev %s\n", std::string(bcd::Version()).c_str());
    return 0;
  }
  if (!args.empty() && (args[0] == "run" || args[0] == "spec" || args[0] == "secret"))
    return Ask(args);
  if (!args.empty() && (args[0] == "exec" || args[0] == "shell" || args[0] == "forward"))
    return TunnelCommand(args);
  if (!args.empty() && args[0] == "install-script") return InstallScript(args);
  if (!args.empty() && args[0] == "upgrade") return Upgrade(args);
  if (args.empty() || args[0] != "up") return Usage();
  std::string dir, protocol = "1..1", bcd = BCD_DEFAULT_BINARY;
  int seconds = 0;
  bool websocket = false, site = false;
  for (std::size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--websocket") {
      websocket = true;
      continue;
    }
    if (args[i] == "--site") {
      site = true;
      continue;
    }
    if (i + 1 >= args.size()) return Usage();
    if (args[i] == "--dir")
      dir = args[++i];
    else if (args[i] == "--seconds")
      seconds = std::atoi(args[++i].c_str());
    else if (args[i] == "--protocol")
      protocol = args[++i];
    else if (args[i] == "--bcd")
      bcd = args[++i];
    else
      return Usage();
  }
  const std::string node_id = site ? "dev-site-1" : "dev-node-1";
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (dir.empty()) {
    std::string pattern = "/tmp/bcd-dev-XXXXXX";
    dir = mkdtemp(pattern.data());
  }
  std::filesystem::create_directories(dir);
  absl::StatusOr<DevPki> pki = DevPki::Create(std::time(nullptr));
  if (!pki.ok())
    return std::fprintf(stderr, "bcd-dev: %s\n", std::string(pki.status().message()).c_str()), 1;
  absl::StatusOr<std::unique_ptr<DevGateway>> gateway =
      DevGateway::Start(*pki, {.protocol = protocol});
  if (!gateway.ok())
    return std::fprintf(stderr, "bcd-dev: %s\n", std::string(gateway.status().message()).c_str()),
           1;
  // bcd installed in the stack's dir, as an installer would put it: daemon.upgrade replaces this
  // copy, never the build's.
  std::filesystem::create_directories(dir + "/bin");
  std::filesystem::create_directories(dir + "/releases");
  {
    absl::StatusOr<std::string> binary = bcd::ReadWholeFile(bcd, std::size_t{1} << 30);
    if (!binary.ok() || !bcd::AtomicWriteFile(dir + "/bin/bcd", *binary, 0755).ok())
      return std::fprintf(stderr, "bcd-dev: cannot install %s in %s/bin\n", bcd.c_str(),
                          dir.c_str()),
             1;
    bcd = dir + "/bin/bcd";
  }
  // The dev release key (its private half stays in the stack's dir, for bcd-dev upgrade) and the
  // HTTPS release server, trusted by bcd through SSL_CERT_FILE.
  absl::StatusOr<bcd::pki::PrivateKey> release_key = bcd::pki::PrivateKey::Generate();
  if (!release_key.ok() ||
      !bcd::AtomicWriteFile(dir + "/release-key.pem", release_key->ToPem(), 0600).ok() ||
      !bcd::AtomicWriteFile(dir + "/dev-ca.pem", pki->serving_ca().Pem(), 0644).ok()) {
    return std::fprintf(stderr, "bcd-dev: cannot write the dev release key\n"), 1;
  }
  absl::StatusOr<std::unique_ptr<bcd::testing::ReleaseServer>> releases =
      bcd::testing::ReleaseServer::Start(dir + "/releases", pki->serving_key().ToPem(),
                                         pki->ServingChainPem());
  if (!releases.ok())
    return std::fprintf(stderr, "bcd-dev: %s\n", std::string(releases.status().message()).c_str()),
           1;
  (void)bcd::AtomicWriteFile(dir + "/release-server",
                             (*releases)->Url("").substr(0, (*releases)->Url("").size() - 1) + "\n",
                             0644);
  setenv("SSL_CERT_FILE", (dir + "/dev-ca.pem").c_str(), 1);
  std::string config = dir + "/config.toml";
  int diag_port = bcd::testing::FreeLoopbackPort();
  std::ofstream(config) << (*gateway)->ConfigToml(dir + "/state") << "[node]\n"
                        << "reboot_command = [\"/bin/true\"]  # the dev stack never reboots\n"
                        << "[diag]\nlisten = \"127.0.0.1:" << diag_port << "\"\n"
                        << "[update]\nrelease_keys = [\""
                        << bcd::pki::Hex(release_key->Public().SpkiSha256()) << "\"]\n"
                        << "trial_seconds = 30\n";
  // A site agent gets the site's BMCs: a Redfish emulator on 127.0.0.1:R and, where ipmi_sim is
  // installed, an IPMI BMC on 127.0.0.2:R (UDP); the site's ports are R, so an address without a
  // protocol reaches Redfish on the first and falls back to IPMI on the second.
  std::unique_ptr<bcd::testing::RedfishBmc> redfish;
  std::unique_ptr<bcd::testing::IpmiBmc> ipmi;
  int boot_port = 0;
  std::string boot_prepare;  // a boot.prepareRamdisk payload for the images built here
  if (site) {
    std::string password = bcd::pki::Hex(bcd::pki::Sha256(release_key->ToPem())).substr(0, 16);
    absl::StatusOr<std::unique_ptr<bcd::testing::RedfishBmc>> r =
        bcd::testing::RedfishBmc::Start(dir + "/bmc/redfish", {.password = password});
    if (!r.ok())
      return std::fprintf(stderr, "bcd-dev: %s\n", std::string(r.status().message()).c_str()), 1;
    redfish = *std::move(r);
    if (bcd::testing::HaveIpmiSim()) {
      absl::StatusOr<std::unique_ptr<bcd::testing::IpmiBmc>> i = bcd::testing::IpmiBmc::Start(
          dir + "/bmc/ipmi", "admin", password, "127.0.0.2", redfish->port());
      if (!i.ok())
        return std::fprintf(stderr, "bcd-dev: %s\n", std::string(i.status().message()).c_str()), 1;
      ipmi = *std::move(i);
    }
    // Dev commands run as workflow "dev", step "dev": the credential is bound to that step.
    (*gateway)->AddSecret("bmc/dev", "admin:" + password, {"dev", "dev", ""});
    std::ofstream(config, std::ios::app)
        << "[site]\nbmc_ca_file = \"" << redfish->cert().string() << "\"\n"
        << "bmc_redfish_port = " << redfish->port() << "\nbmc_ipmi_port = " << redfish->port()
        << "\n";
    std::printf(
        "BMCs: Redfish emulator at https://127.0.0.1:%d, %s; credential secret bmc/dev\n",
        redfish->port(),
        ipmi ? ("ipmi_sim at 127.0.0.2:" + std::to_string(redfish->port()) + " (UDP)").c_str()
             : "no IPMI BMC (ipmi_sim and ipmitool are not installed)");
    // The boot server on 127.0.0.1:B, which a QEMU machine on the user network reaches as
    // 10.0.2.2:B; a kernel and a ramdisk to boot, served by the release server for the boot server
    // to cache against their pins; the discovery token a secret bound to the dev step.
    boot_port = bcd::testing::FreeLoopbackPort();
    std::ofstream(config, std::ios::app) << "[boot]\nlisten = \"127.0.0.1:" << boot_port
                                         << "\"\nurl = \"http://10.0.2.2:" << boot_port << "\"\n";
    (*gateway)->AddSecret("boot/dev", "dev-" + bcd::pki::Hex(bcd::pki::RandomBytes(16)),
                          {"dev", "dev", ""});
    std::printf(
        "boot server: http://127.0.0.1:%d (machines on QEMU's user network: "
        "http://10.0.2.2:%d/boot.ipxe); discovery token secret boot/dev\n",
        boot_port, boot_port);
    absl::StatusOr<bcd::testing::BootImages> images =
        bcd::testing::MakeBootImages(dir + "/releases");
    if (images.ok()) {
      nlohmann::json prepare = {{"mac", "52:54:00:12:34:56"},
                                {"boot_entry_id", "dev-1"},
                                {"kernel_url", (*releases)->Url("vmlinuz")},
                                {"initrd_url", (*releases)->Url("initrd.gz")},
                                {"kernel_sha256", absl::Base64Escape(images->kernel_sha256)},
                                {"initrd_sha256", absl::Base64Escape(images->initrd_sha256)},
                                {"cmdline", "console=ttyS0 panic=-1"},
                                {"discovery_token_ref", "boot/dev"},
                                {"expires_at", std::to_string(std::time(nullptr) + 6 * 24 * 3600)}};
      boot_prepare = prepare.dump();
    } else {
      std::printf("no boot images: %s\n", std::string(images.status().message()).c_str());
    }
  }
  std::printf("releases: %s (signed by the dev release key, pinned in the config)\n",
              (*releases)->Url("").c_str());
  std::printf(
      "dev gateway: %s (protocol %s), WebSocket wss://127.0.0.1:%d/v1/session, serving "
      "CA pin %s\n",
      (*gateway)->target().c_str(), protocol.c_str(), (*gateway)->websocket_port(),
      pki->ServingCaPinHex().c_str());
  std::printf("diagnostics: http://127.0.0.1:%d/metrics, /healthz, /readyz\n", diag_port);
  std::printf("config: %s\n\n$ bcd join --token ... --config %s\n", config.c_str(), config.c_str());
  std::fflush(stdout);
  // The token goes in a file only this user reads, never on a command line others can see.
  std::filesystem::path token_file = std::filesystem::path(dir) / "join-token";
  if (absl::Status s = bcd::AtomicWriteFile(token_file, (*gateway)->AddJoinToken(node_id), 0600);
      !s.ok()) {
    return std::fprintf(stderr, "bcd-dev: %s\n", std::string(s.message()).c_str()), 1;
  }
  int joined = WaitChild(SpawnChild({bcd, "join", "--config", config, "--token-file",
                                     token_file.string(), "--role", site ? "site" : "node"}));
  std::filesystem::remove(token_file);
  if (joined != 0) return std::fprintf(stderr, "bcd-dev: bcd join exited %d\n", joined), 1;
  if (websocket) {
    std::ofstream(config, std::ios::app) << (*gateway)->WebSocketConfigToml();
    std::printf("\nconfig: added [websocket]: the node runs over the WebSocket transport\n");
  }

  const char* mode = site ? "site" : "node";
  std::printf("\n$ bcd %s --config %s\n", mode, config.c_str());
  std::fflush(stdout);
  pid_t node = SpawnChild({bcd, mode, "--config", config});
  bcd::testing::DevControlPlane control(&*pki, gateway->get());
  if (absl::Status s = control.Serve(std::filesystem::path(dir) / "dev.sock", node_id); !s.ok()) {
    std::fprintf(stderr, "bcd-dev: %s\n", std::string(s.message()).c_str());
  }
  {
    std::error_code ec;
    std::filesystem::create_directories(CurrentFile().parent_path(), ec);
    if (ec || bcd::AtomicWriteFile(CurrentFile(), dir + "\n", 0600).ok() == false) {
      std::fprintf(stderr,
                   "bcd-dev: cannot record the stack in %s: run, spec and the tunnel "
                   "commands need --dir %s\n",
                   CurrentFile().c_str(), dir.c_str());
    }
  }
  bool trusted = false;
  std::size_t shown = 0;
  bool welcomed = false;
  timespec tick{0, 200 * 1000 * 1000};
  auto deadline = std::time(nullptr) + seconds;
  while (seconds == 0 || std::time(nullptr) < deadline) {
    if (int signal = sigtimedwait(&signals, nullptr, &tick); signal > 0) {
      std::printf("\nbcd-dev: %s\n", strsignal(signal));
      break;
    }
    if (waitpid(node, nullptr, WNOHANG) == node) {
      std::printf("bcd %s exited\n", mode);
      node = -1;
      break;
    }
    if (!welcomed && (*gateway)->LastHello(node_id)) {
      welcomed = true;
      std::printf("gateway: Hello from %s over %s %s\n", node_id.c_str(),
                  (*gateway)->LastTransport(node_id).c_str(),
                  bcd::testing::ProtoJson(*(*gateway)->LastHello(node_id)).c_str());
    }
    if (welcomed && !trusted) {
      // The control plane's approver set: destructive kinds need 2 of 3 approvals from now on.
      bettercompute::agent::v1::ServerFrame frame;
      *frame.mutable_trust() = control.ApproverBundle();
      trusted = (*gateway)->Push(node_id, frame);
      if (trusted) {
        std::printf("gateway: sent trust bundle 2 with the dev approver set (2 of 3)\n");
        // The access section with the dev tunnel keys, so bcd-dev exec/shell/forward work.
        (void)control.ApplySpec(node_id, "{}", std::chrono::seconds(10));
        std::printf("\nready: bcd-dev run inventory.refresh   (in another shell)\n");
        if (site) {
          std::printf(
              "       bcd-dev run bmc.powerStatus '{\"bmc\": {\"address\": \"127.0.0.1\", "
              "\"credential_ref\": \"bmc/dev\"}}'   (Redfish)\n");
          if (ipmi) {
            std::printf(
                "       bcd-dev run bmc.powerOn '{\"bmc\": {\"address\": \"127.0.0.2\", "
                "\"credential_ref\": \"bmc/dev\"}}'   (IPMI)\n");
          }
          if (!boot_prepare.empty()) {
            std::printf("       bcd-dev run boot.prepareRamdisk '%s'\n", boot_prepare.c_str());
            std::printf(
                "       qemu-system-x86_64 -accel tcg -m 512 -nographic -no-reboot -netdev "
                "user,id=n0,bootfile=http://10.0.2.2:%d/boot.ipxe -device "
                "virtio-net-pci,netdev=n0,mac=52:54:00:12:34:56 -boot n   (boots it)\n",
                boot_port);
          }
        }
        std::printf("\n");
      }
    }
    auto frames = (*gateway)->Received(node_id);
    for (; shown < frames.size(); ++shown)
      std::printf("gateway: received %s\n", bcd::testing::ProtoJson(frames[shown]).c_str());
    std::fflush(stdout);
  }
  if (node > 0) {
    kill(node, SIGTERM);
    std::printf("\nbcd %s stopped with SIGTERM, exit %d\n", mode, WaitChild(node));
  }
  std::printf("\n$ bcd status --config %s\n", config.c_str());
  std::fflush(stdout);
  WaitChild(SpawnChild({bcd, "status", "--config", config}));
  std::printf("\nthe dev stack's files stay in %s\n", dir.c_str());
  return 0;
}
