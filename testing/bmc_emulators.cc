#include "testing/bmc_emulators.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "base/subprocess.h"
#include "config/values.h"
#include "fmt/format.h"
#include "testing/child_process.h"
#include "transport/http_client.h"

namespace bcd::testing {
namespace {

std::string ReadAll(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void Write(const std::filesystem::path& path, const std::string& text, mode_t mode = 0600) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  chmod(path.c_str(), mode);
}

int FreeUdpPort() {
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
    close(fd);
    return 0;  // ipmi_sim then fails to start, saying so
  }
  close(fd);
  return ntohs(addr.sin_port);
}

void Kill(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGKILL);
  WaitChild(pid, std::chrono::seconds(10));
}

}  // namespace

absl::StatusOr<std::unique_ptr<RedfishBmc>> RedfishBmc::Start(const std::filesystem::path& dir,
                                                              Options options) {
  std::filesystem::create_directories(dir);
  chmod(dir.c_str(), 0700);
  Write(dir / "password", options.password + "\n");
  std::filesystem::path ready = dir / "ready.json";
  std::filesystem::remove(ready);
  std::string command = fmt::format(
      "exec /usr/bin/python3 {} --dir {} --host {} --port {} --user {} --password-file {}",
      BCD_REDFISH_EMULATOR, dir.string(), options.host, options.port, options.user,
      (dir / "password").string());
  for (const std::string& arg : options.args) command += " '" + arg + "'";
  command += " > " + ready.string() + " 2> " + (dir / "emulator.log").string();
  auto bmc = std::unique_ptr<RedfishBmc>(new RedfishBmc());
  bmc->pid_ = SpawnChild({"sh", "-c", command});
  if (bmc->pid_ <= 0) return absl::InternalError("cannot start the Redfish emulator");
  bmc->host_ = options.host;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  nlohmann::json line;
  while (std::chrono::steady_clock::now() < deadline) {
    std::string text = ReadAll(ready);
    if (!text.empty() && text.back() == '\n') {
      line = nlohmann::json::parse(text, nullptr, false);
      break;
    }
    if (waitpid(bmc->pid_, nullptr, WNOHANG) == bmc->pid_) {
      bmc->pid_ = -1;
      return absl::InternalError("the Redfish emulator exited: " + ReadAll(dir / "emulator.log"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!line.is_object()) {
    return absl::DeadlineExceededError("the Redfish emulator did not say it listens: " +
                                       ReadAll(dir / "emulator.log"));
  }
  bmc->port_ = line.value("port", 0);
  bmc->spki_hex_ = line.value("spki_sha256", "");
  bmc->cert_ = line.value("cert", "");
  absl::StatusOr<Sha256Pin> pin = Sha256Pin::ParseHex(bmc->spki_hex_);
  if (!pin.ok()) return pin.status();
  bmc->spki_.assign(reinterpret_cast<const char*>(pin->bytes().data()), pin->bytes().size());
  return bmc;
}

RedfishBmc::~RedfishBmc() { Kill(pid_); }

absl::StatusOr<nlohmann::json> RedfishBmc::Ask(const std::string& method, const std::string& path,
                                               const std::string& body) const {
  absl::StatusOr<DeviceAnswer> answer = HttpDeviceExchange({.method = method,
                                                            .host = host_,
                                                            .port = static_cast<uint16_t>(port_),
                                                            .target = path,
                                                            .body = body,
                                                            .trust = {.spki_sha256 = spki_},
                                                            .timeout = std::chrono::seconds(10)});
  if (!answer.ok()) return answer.status();
  if (answer->status != 200) {
    return absl::InternalError(
        fmt::format("{} {}: {} {}", method, path, answer->status, answer->body));
  }
  return nlohmann::json::parse(answer->body, nullptr, false);
}

absl::StatusOr<nlohmann::json> RedfishBmc::State() const {
  return Ask("GET", "/emulator/state", "");
}

absl::Status RedfishBmc::SetFaults(const nlohmann::json& faults) const {
  return Ask("PATCH", "/emulator/faults", faults.dump()).status();
}

bool HaveIpmiSim() {
  return access("/usr/bin/ipmi_sim", X_OK) == 0 && access("/usr/bin/ipmitool", X_OK) == 0;
}

absl::StatusOr<std::unique_ptr<IpmiBmc>> IpmiBmc::Start(const std::filesystem::path& dir,
                                                        const std::string& user,
                                                        const std::string& password,
                                                        const std::string& host, int port) {
  std::filesystem::create_directories(dir / "state");
  chmod(dir.c_str(), 0700);
  auto bmc = std::unique_ptr<IpmiBmc>(new IpmiBmc());
  bmc->dir_ = dir;
  bmc->host_ = host;
  bmc->port_ = port != 0 ? port : FreeUdpPort();
  Write(dir / "power", "0\n");
  // ipmi_sim runs `chassis get power`, `chassis set boot pxe` ...: name:value lines back.
  Write(dir / "chassis",
        fmt::format("#!/bin/sh\n"
                    "d='{}'\n"
                    "echo \"$*\" >> \"$d/calls\"\n"
                    "op=$1; shift\n"
                    "case \"$op\" in\n"
                    "get) for p in \"$@\"; do case $p in\n"
                    "  power) echo \"power:$(cat \"$d/power\")\";;\n"
                    "  boot) echo \"boot:$(cat \"$d/boot\" 2>/dev/null || echo default)\";;\n"
                    "  esac; done;;\n"
                    "set) while [ $# -gt 1 ]; do echo \"$2\" > \"$d/$1\"; shift 2; done;;\n"
                    "esac\n",
                    dir.string()),
        0700);
  Write(dir / "lan.conf",
        fmt::format("name \"bcd-dev\"\n"
                    "set_working_mc 0x20\n"
                    "  startlan 1\n"
                    "    addr {} {}\n"
                    "    priv_limit admin\n"
                    "    allowed_auths_callback none md2 md5 straight\n"
                    "    allowed_auths_user none md2 md5 straight\n"
                    "    allowed_auths_operator none md2 md5 straight\n"
                    "    allowed_auths_admin none md2 md5 straight\n"
                    "    guid a123456789abcdefa123456789abcdef\n"
                    "  endlan\n"
                    "  chassis_control \"{}\"\n"
                    "  user 2 true \"{}\" \"{}\" admin 10 none md2 md5 straight\n",
                    host, bmc->port_, (dir / "chassis").string(), user, password));
  Write(dir / "emu.cmds",
        "mc_setbmc 0x20\n"
        "mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr\n"
        "mc_enable 0x20\n");
  bmc->pid_ = SpawnChild({"sh", "-c",
                          fmt::format("exec ipmi_sim -n -c {} -f {} -s {} > {} 2>&1",
                                      (dir / "lan.conf").string(), (dir / "emu.cmds").string(),
                                      (dir / "state").string(), (dir / "sim.log").string())});
  if (bmc->pid_ <= 0) return absl::InternalError("cannot start ipmi_sim");
  // Ready when ipmitool gets an answer.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::string last;
  while (std::chrono::steady_clock::now() < deadline) {
    absl::StatusOr<ToolRun> run =
        RunTool({"ipmitool", "-I", "lanplus", "-H", host, "-p", std::to_string(bmc->port_), "-U",
                 user, "-E", "-C", "3", "-N", "1", "-R", "1", "chassis", "power", "status"},
                {"IPMI_PASSWORD=" + password}, std::chrono::seconds(5));
    if (run.ok() && run->output.find("Chassis Power is") != std::string::npos) return bmc;
    last = run.ok() ? run->output : std::string(run.status().message());
    if (waitpid(bmc->pid_, nullptr, WNOHANG) == bmc->pid_) {
      bmc->pid_ = -1;
      return absl::InternalError("ipmi_sim exited: " + ReadAll(dir / "sim.log"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return absl::DeadlineExceededError("ipmi_sim does not answer: " + last);
}

IpmiBmc::~IpmiBmc() { Kill(pid_); }

std::string IpmiBmc::Power() const {
  std::string text = ReadAll(dir_ / "power");
  return text.starts_with("1") ? "on" : "off";
}

std::string IpmiBmc::Boot() const {
  std::string text = ReadAll(dir_ / "boot");
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text.empty() ? "default" : text;
}

std::vector<std::string> IpmiBmc::Calls() const {
  std::vector<std::string> calls;
  std::istringstream in(ReadAll(dir_ / "calls"));
  for (std::string line; std::getline(in, line);) calls.push_back(line);
  return calls;
}

}  // namespace bcd::testing
