#include "app/cli.h"

#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string_view>
#include <system_error>
#include <thread>

#include "absl/strings/str_join.h"
#include "app/modes.h"
#include "app/notify.h"
#include "base/files.h"
#include "base/mutex.h"
#include "base/version.h"
#include "config/config.h"
#include "daemon/agent.h"
#include "daemon/control.h"
#include "daemon/identity/join.h"
#include "daemon/upgrade/trial.h"
#include "fmt/format.h"
#include "fmt/ostream.h"
#include "install/install_script.h"
#include "modes/common/inventory.h"
#include "nlohmann/json.hpp"
#include "proto/absl_compat.h"
#include "proto/version.h"
#include "transport/proxy.h"

namespace bcd {
namespace {

struct Command {
  std::string_view name;
  std::string_view usage;  // after "bcd NAME"
  std::string_view summary;
  std::string_view arrives;  // for commands this build does not do yet: what they wait for
};

constexpr Command kCommands[] = {
    {"join", "--token T | --token-file F|- [--role node|site] | --node-id N [--attestor A]",
     "join the fleet: key, CSR, Join, store identity and trust bundle", ""},
    {"node", "", "run the node mode in the foreground until SIGTERM", ""},
    {"site", "", "run the site agent in the foreground until SIGTERM (its kinds come later)", ""},
    {"ramdisk", "",
     "run the ramdisk mode in the foreground until SIGTERM (its join and kinds come later)", ""},
    {"status", "[--json]", "show this node's identity, trust and session state", ""},
    {"inventory", "", "print this machine's hardware claims as JSON", ""},
    {"install-script",
     "--gateway-url U --ca-pin P --token T [--role node|site] [--websocket-url W]\n"
     "    [--proxy-ca-file F] [--release-key K]... [--binary-url URL --binary-sha256 H]\n"
     "    [--gateway-server-name N]",
     "print the installer for a new machine", ""},
    {"version", "[--json]", "print the version, protocol range and capabilities", ""},
    {"upgrade-recover", "",
     "roll back an upgrade whose new version stopped during its trial (the unit's ExecStartPre "
     "runs it with the previous binary)",
     ""},
};

const Command* FindCommand(std::string_view name) {
  for (const Command& command : kCommands) {
    if (command.name == name) return &command;
  }
  return nullptr;
}

void PrintUsage(std::ostream& out) {
  fmt::print(out,
             "Usage: bcd COMMAND [--config PATH] [options]\n\n"
             "The node-side agent of the compute fleet's control plane: it dials out to the\n"
             "gateway, holds one session and does only what signed intent asks.\n\n"
             "Commands:\n");
  for (const Command& command : kCommands) {
    fmt::print(out, "  {:<15} {}\n", command.name, command.summary);
  }
  fmt::print(out,
             "\nOptions:\n"
             "  --config PATH   the config file (default /etc/bcd/config.toml), for every command\n"
             "  --help          print this help, or a command's with bcd COMMAND --help\n"
             "  --version       print the version\n");
}

struct Flags {
  std::optional<std::filesystem::path> config;
  bool help = false;
  std::vector<std::string> rest;  // flags this layer does not know, for the command itself
};

// Takes --config PATH, --config=PATH and --help; leaves everything else in `rest`.
std::optional<Flags> ParseFlags(std::span<const std::string> args, std::string_view command,
                                std::ostream& err) {
  Flags flags;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      flags.help = true;
    } else if (arg == "--config") {
      if (i + 1 >= args.size()) {
        fmt::print(err, "bcd {}: --config needs a path\n", command);
        return std::nullopt;
      }
      flags.config = args[++i];
    } else if (arg.starts_with("--config=")) {
      flags.config = arg.substr(9);
    } else {
      flags.rest.push_back(arg);
    }
  }
  if (flags.config && flags.config->empty()) {
    fmt::print(err, "bcd {}: --config needs a path\n", command);
    return std::nullopt;
  }
  return flags;
}

// The config named by --config, else the default file when it exists, else the embedded default.
std::optional<Config> LoadConfig(const Flags& flags, const CliEnv& env) {
  std::filesystem::path path = flags.config.value_or(env.default_config);
  std::error_code ec;
  if (!flags.config && !std::filesystem::exists(path, ec)) return Config::EmbeddedDefault();
  absl::StatusOr<Config> config = Config::Load(path);
  if (!config.ok()) {
    fmt::print(env.err, "bcd: bad config:\n{}\n", ToStd(config.status().message()));
    return std::nullopt;
  }
  return *std::move(config);
}

// The capabilities each mode's Hello advertises with this config's transport.
int Version(const Config& config, bool json, const CliEnv& env) {
  bool websocket = config.websocket().has_value();
  if (json) {
    nlohmann::json doc = {
        {"version", bcd::Version()},
        {"protocol",
         {{"min", proto::kProtocolVersion.min()}, {"max", proto::kProtocolVersion.max()}}},
        {"transport", websocket ? "websocket" : "grpc"},
        {"capabilities", nlohmann::json::object()}};
    for (proto::Mode mode : kModes) {
      doc["capabilities"][std::string(proto::ModeName(mode))] =
          AllCapabilities(*MakeMode(mode), websocket);
    }
    fmt::print(env.out, "{}\n", doc.dump());
    return kExitOk;
  }
  fmt::print(env.out, "bcd {}\nprotocol {}\n", bcd::Version(), proto::kProtocolVersion.ToString());
  for (proto::Mode mode : kModes) {
    std::vector<std::string> capabilities = AllCapabilities(*MakeMode(mode), websocket);
    fmt::print(env.out, "capabilities ({}): {}{}\n", proto::ModeName(mode),
               absl::StrJoin(capabilities, ", "),
               websocket ? " (no tunnels: they need the gRPC transport)" : "");
  }
  return kExitOk;
}

int Inventory(const CliEnv& env) {
  InventorySources sources;
  sources.root = env.root;
  sources.architecture = env.architecture;
  sources.runner = env.runner;
  sources.now = env.now ? env.now() : 0;
  fmt::print(env.out, "{}\n", InventoryToJson(CollectInventory(sources)));
  return kExitOk;
}

// The value after `name` in `rest` (removing both), or nullopt when absent; sets *bad when the
// value is missing.
std::optional<std::string> TakeOption(std::vector<std::string>* rest, std::string_view name,
                                      bool* bad) {
  for (std::size_t i = 0; i < rest->size(); ++i) {
    const std::string& arg = (*rest)[i];
    if (arg == name) {
      if (i + 1 >= rest->size()) {
        *bad = true;
        return std::nullopt;
      }
      std::string value = (*rest)[i + 1];
      rest->erase(rest->begin() + static_cast<long>(i), rest->begin() + static_cast<long>(i) + 2);
      return value;
    }
    if (arg.starts_with(std::string(name) + "=")) {
      std::string value = arg.substr(name.size() + 1);
      rest->erase(rest->begin() + static_cast<long>(i));
      return value;
    }
  }
  return std::nullopt;
}

// The token in `path`, or on stdin for "-" (the installer pipes it in, so it never shows in
// `ps`): its first line, which must not be empty.
absl::StatusOr<std::string> ReadToken(const std::string& path, const CliEnv& env) {
  absl::StatusOr<std::string> text = absl::InvalidArgumentError("stdin is not available");
  if (path == "-") {
    if (env.in != nullptr) {
      std::string line;
      std::getline(*env.in, line);
      text = line;
    }
  } else {
    text = ReadWholeFile(path, 64 * 1024);
  }
  if (!text.ok()) return text.status();
  std::string value = text->substr(0, text->find('\n'));
  if (!value.empty() && value.back() == '\r') value.pop_back();
  if (value.empty()) return absl::InvalidArgumentError("no token in it");
  return value;
}

// The exit code for a failed join.
int JoinFailed(const absl::Status& status, const CliEnv& env) {
  fmt::print(env.err, "bcd join: {}\n", ToStd(status.message()));
  switch (status.code()) {
    case absl::StatusCode::kPermissionDenied:
      return kExitJoinRefused;
    case absl::StatusCode::kInvalidArgument:
      return kExitUsage;
    default:
      return kExitOther;
  }
}

int Join(Flags flags, const CliEnv& env) {
  bool bad = false;
  std::optional<std::string> token = TakeOption(&flags.rest, "--token", &bad);
  std::optional<std::string> token_file = TakeOption(&flags.rest, "--token-file", &bad);
  std::optional<std::string> role = TakeOption(&flags.rest, "--role", &bad);
  std::optional<std::string> node_id = TakeOption(&flags.rest, "--node-id", &bad);
  std::optional<std::string> attestor = TakeOption(&flags.rest, "--attestor", &bad);
  std::optional<std::string> credential_file = TakeOption(&flags.rest, "--credential-file", &bad);
  if (bad || !flags.rest.empty()) {
    fmt::print(
        env.err, "bcd join: {}\n",
        bad ? "an option is missing its value" : "unknown option \"" + flags.rest.front() + "\"");
    return kExitUsage;
  }
  if (token && token_file) {
    fmt::print(env.err, "bcd join: give --token or --token-file, not both\n");
    return kExitUsage;
  }
  if (token_file) {
    absl::StatusOr<std::string> value = ReadToken(*token_file, env);
    if (!value.ok()) {
      fmt::print(env.err, "bcd join: --token-file {}: {}\n", *token_file,
                 ToStd(value.status().message()));
      return kExitUsage;
    }
    token = *value;
  }
  if (token.has_value() == node_id.has_value()) {
    fmt::print(env.err, "bcd join: give either --token T (or --token-file F) or --node-id N\n");
    return kExitUsage;
  }
  JoinSpec spec;
  if (role && *role != "node" && *role != "site") {
    fmt::print(env.err, "bcd join: --role must be node or site, got \"{}\"\n", *role);
    return kExitUsage;
  }
  spec.role =
      role == "site" ? bettercompute::common::v1::ROLE_SITE : bettercompute::common::v1::ROLE_NODE;
  if (token) {
    spec.attestor = attestor.value_or("join-token");
    spec.evidence = *token;
  } else {
    spec.attestor = attestor.value_or("provisioned");
    spec.node_id = *node_id;
    std::string path = credential_file.value_or("/etc/bcd/provisioning-credential");
    absl::StatusOr<std::string> credential = ReadWholeFile(path, 64 * 1024);
    if (!credential.ok()) {
      fmt::print(env.err, "bcd join: the provisioning credential: {}\n",
                 ToStd(credential.status().message()));
      return kExitUsage;
    }
    spec.evidence = *credential;
  }
  std::filesystem::path path = flags.config.value_or(env.default_config);
  absl::StatusOr<Config> config = Config::Load(path);
  if (!config.ok()) {
    fmt::print(env.err, "bcd: bad config:\n{}\n", ToStd(config.status().message()));
    return kExitUsage;
  }
  InventorySources sources{env.root, env.architecture, env.runner, env.now ? env.now() : 0};
  spec.claims = CollectInventory(sources);
  spec.now = [&env] { return static_cast<int64_t>(env.now()); };
  spec.sleep = env.sleep;
  spec.progress = &env.out;
  absl::StatusOr<Identity> identity = JoinFleet(*config, spec);
  return identity.ok() ? kExitOk : JoinFailed(identity.status(), env);
}

// Prints the installer the flags describe; reads the files they name (proxy CA, release keys).
int InstallScript(const Flags& flags, const CliEnv& env) {
  absl::StatusOr<install::InstallOptions> options = install::ParseInstallFlags(
      flags.rest, [](const std::string& path) { return ReadWholeFile(path, 64 * 1024); });
  absl::StatusOr<std::string> script =
      options.ok() ? install::GenerateInstallScript(*options) : options.status();
  if (!script.ok()) {
    fmt::print(env.err, "bcd install-script: {}\n", ToStd(script.status().message()));
    return kExitUsage;
  }
  fmt::print(env.out, "{}", *script);
  return kExitOk;
}

// Under systemd (Type=notify): READY once the first session is up, or after 30 s without one
// (the daemon is running and redialing; a unit must not sit in "activating" for a gateway that is
// down); WATCHDOG=1 while the liveness check passes (Agent::Healthy, what /healthz serves);
// STOPPING=1 on the way out. Does nothing
// without a notify socket.
class SystemdLoop {
 public:
  SystemdLoop(std::optional<SystemdNotifier> systemd, Agent* agent)
      : systemd_(std::move(systemd)), agent_(agent) {
    if (systemd_) thread_ = std::thread([this] { Loop(); });
  }
  ~SystemdLoop() { Stopping(); }
  // `handing_over`: the process re-executes into another binary (daemon.upgrade) and stays the
  // service's main process, so systemd is not told it stops.
  void Stopping(bool handing_over = false) {
    if (!thread_.joinable()) return;
    systemd_->Notify(handing_over ? "STATUS=re-executing after an upgrade" : "STOPPING=1");
    {
      MutexLock lock(mu_);
      finished_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  void Loop() {
    bool welcomed = agent_->WaitUntil(
        [](const SessionSnapshot& s) { return s.welcomes > 0 || s.state == "stopped"; },
        std::chrono::seconds(30));
    SessionSnapshot s = agent_->Snapshot();
    systemd_->Notify(welcomed && s.welcomes > 0
                         ? "READY=1\nSTATUS=connected"
                         : "READY=1\nSTATUS=no session yet: " + s.last_error.substr(0, 200));
    UniqueLock lock(mu_);
    while (!finished_) {
      auto interval = systemd_->watchdog_interval().value_or(std::chrono::seconds(3600));
      if (cv_.wait_for(lock, interval,
                       [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finished_; }))
        break;
      lock.unlock();
      // The liveness check /healthz reads too: no ping while the engine does not answer.
      if (absl::Status alive = agent_->Healthy(); !alive.ok()) {
        systemd_->Notify("STATUS=" + std::string(ToStd(alive.message())).substr(0, 200));
      } else if (systemd_->watchdog_interval()) {
        systemd_->Notify("WATCHDOG=1");
      }
      lock.lock();
    }
  }

  std::optional<SystemdNotifier> systemd_;
  Agent* agent_;
  Mutex mu_;
  CondVar cv_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

std::vector<char*> ArgvOf(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  return argv;
}

// After a daemon.upgrade: the guard (the previous binary, which does not depend on the new one
// working) is started beside this process, and this process becomes the installed binary. Returns
// only when the exec failed.
int Reexecute(const ExecRequest& request, const CliEnv& env, Logger& log) {
  std::vector<std::string> args = request.argv.empty() ? env.argv : request.argv;
  if (args.empty()) args.push_back(request.binary.string());
  if (request.guard) {
    upgrade::Layout layout{.binary = request.binary, .state_dir = request.state_dir};
    std::vector<std::string> guard = {layout.previous().string(),
                                      "upgrade-guard",
                                      "--binary",
                                      request.binary.string(),
                                      "--state-dir",
                                      request.state_dir.string(),
                                      "--pid",
                                      std::to_string(getpid()),
                                      "--"};
    guard.insert(guard.end(), args.begin(), args.end());
    std::vector<char*> argv = ArgvOf(guard);
    pid_t pid = 0;
    if (int error = posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ);
        error != 0) {
      // The new version's own trial timer still rolls back; the guard only adds a second way.
      log.Warn("upgrade.guard_failed", {{"error", std::strerror(error)}});
    }
  }
  log.Info("upgrade.exec", {{"binary", request.binary.string()}});
  std::vector<char*> argv = ArgvOf(args);
  execv(request.binary.c_str(), argv.data());
  fmt::print(env.err, "bcd: cannot execute {}: {}\n", request.binary.string(),
             std::strerror(errno));
  return kExitOther;
}

// bcd upgrade-recover: the unit's ExecStartPre, run with the previous binary.
int UpgradeRecover(const Flags& flags, const CliEnv& env) {
  if (!flags.rest.empty()) {
    fmt::print(env.err, "bcd upgrade-recover: unknown option \"{}\"\n", flags.rest.front());
    return kExitUsage;
  }
  std::optional<Config> config = LoadConfig(flags, env);
  if (!config) return kExitUsage;
  std::string binary = env.binary.string();
  if (binary.ends_with(".previous")) binary.resize(binary.size() - 9);
  if (binary.empty()) {
    fmt::print(env.err, "bcd upgrade-recover: the path of this binary is unknown\n");
    return kExitOther;
  }
  absl::StatusOr<std::string> done =
      upgrade::Recover({.binary = binary, .state_dir = config->state_dir()});
  if (!done.ok()) {
    fmt::print(env.err, "bcd upgrade-recover: {}\n", ToStd(done.status().message()));
    return kExitOther;
  }
  fmt::print(env.out, "bcd upgrade-recover: {}\n", *done);
  return kExitOk;
}

// bcd upgrade-guard: started by Reexecute, never by people.
int UpgradeGuard(const Flags& flags, const CliEnv& env) {
  upgrade::GuardOptions options;
  const std::vector<std::string>& rest = flags.rest;
  std::size_t i = 0;
  for (; i < rest.size(); ++i) {
    if (rest[i] == "--") {
      ++i;
      break;
    }
    if (i + 1 >= rest.size()) break;
    if (rest[i] == "--binary") {
      options.layout.binary = rest[++i];
    } else if (rest[i] == "--state-dir") {
      options.layout.state_dir = rest[++i];
    } else if (rest[i] == "--pid") {
      options.main = static_cast<pid_t>(std::atoi(rest[++i].c_str()));
    } else {
      break;
    }
  }
  options.restart.assign(rest.begin() + static_cast<std::ptrdiff_t>(i), rest.end());
  if (options.layout.binary.empty() || options.layout.state_dir.empty() || options.main <= 1) {
    fmt::print(env.err, "usage: bcd upgrade-guard --binary B --state-dir D --pid P -- ARGV...\n");
    return kExitUsage;
  }
  options.supervised = std::getenv("INVOCATION_ID") != nullptr;  // systemd restarts the service
  options.now = [&env] { return static_cast<int64_t>(env.now()); };
  options.say = [&env](const std::string& line) {
    fmt::print(env.err, "bcd upgrade-guard: {}\n", line);
  };
  return upgrade::RunGuard(options);
}

// Runs a mode in the foreground until SIGTERM or SIGINT.
int RunMode(const Flags& flags, const CliEnv& env, proto::Mode mode) {
  if (!flags.rest.empty()) {
    fmt::print(env.err, "bcd {}: unknown option \"{}\"\n", proto::ModeName(mode),
               flags.rest.front());
    return kExitUsage;
  }
  absl::StatusOr<Config> config = Config::Load(flags.config.value_or(env.default_config));
  if (!config.ok()) {
    fmt::print(env.err, "bcd: bad config:\n{}\n", ToStd(config.status().message()));
    return kExitUsage;
  }
  // Blocked before any thread exists, so every later thread (gRPC's too) inherits the mask and only
  // the waiter below receives them; it stops the engine.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGUSR1);  // only to release the waiter when the engine stops by itself
  sigset_t previous;
  pthread_sigmask(SIG_BLOCK, &signals, &previous);
  Logger log(&env.err, config->log_level());
  log.set_format(config->log_format());
  log.set_priority_prefix(&env.err == &std::cerr &&
                          IsJournalStream(STDERR_FILENO, transport::ProcessEnv));
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  absl::StatusOr<std::unique_ptr<Agent>> daemon =
      Agent::Create(*config, MakeMode(mode),
                    {.now = [&env] { return static_cast<int64_t>(env.now()); },
                     .uniform01 = [&] { return uniform(rng); },
                     .log = &log,
                     .binary = env.binary,
                     .machine = env.architecture,
                     .argv = env.argv});
  if (!daemon.ok()) {
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);  // a caller in the same process (tests)
    fmt::print(env.err, "bcd {}: {}\n", proto::ModeName(mode), ToStd(daemon.status().message()));
    return daemon.status().code() == absl::StatusCode::kUnauthenticated ? kExitIdentityGone
                                                                        : kExitOther;
  }
  std::thread waiter([&] {
    int signal = 0;
    sigwait(&signals, &signal);
    if (signal != SIGUSR1) {
      log.Info("signal", {{"signal", signal == SIGTERM ? "SIGTERM" : "SIGINT"}});
      (*daemon)->Stop();
    }
  });
  SystemdLoop systemd(SystemdNotifier::FromEnvironment(transport::ProcessEnv), daemon->get());
  absl::Status status = (*daemon)->Run();
  std::optional<ExecRequest> exec = (*daemon)->exec_request();
  systemd.Stopping(/*handing_over=*/exec.has_value());
  pthread_kill(waiter.native_handle(), SIGUSR1);
  waiter.join();
  if (exec) {
    daemon->reset();  // every part closed and the state dir unlocked before the next binary
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    return Reexecute(*exec, env, log);
  }
  if (status.ok()) return kExitOk;
  fmt::print(env.err, "bcd {}: {}\n", proto::ModeName(mode), ToStd(status.message()));
  return kExitIdentityGone;
}

// From the running daemon's control socket, else from the state dir; as JSON with --json.
int Status(Flags flags, const CliEnv& env) {
  bool json = std::erase(flags.rest, "--json") > 0;
  if (!flags.rest.empty()) {
    fmt::print(env.err, "bcd status: unknown option \"{}\"\n", flags.rest.front());
    return kExitUsage;
  }
  std::optional<Config> config = LoadConfig(flags, env);
  if (!config) return kExitUsage;
  std::filesystem::path socket = config->state_dir() / "bcd.sock";
  nlohmann::json status;
  if (absl::StatusOr<std::string> live = QueryControl(socket); live.ok()) {
    status = nlohmann::json::parse(*live, nullptr, /*allow_exceptions=*/false);
    if (status.is_discarded()) {
      // A daemon of a version that answered in text: shown as it is.
      if (json) {
        fmt::print(env.err, "bcd status: the daemon on {} does not answer in JSON\n",
                   socket.string());
        return kExitOther;
      }
      fmt::print(env.out, "{}", *live);
      return kExitOk;
    }
  } else {
    absl::StatusOr<nlohmann::json> stored =
        StateDirStatus(config->state_dir(), static_cast<int64_t>(env.now()));
    if (!stored.ok()) {
      fmt::print(env.err, "bcd status: {}\n", ToStd(stored.status().message()));
      return kExitOther;
    }
    status = *std::move(stored);
    std::string binary = env.binary.string();  // the binary installed is the one asked
    if (binary.ends_with(".previous")) binary.resize(binary.size() - 9);
    status["upgrade"] =
        upgrade::UpgradeStatus({.binary = binary, .state_dir = config->state_dir()});
    status["daemon"] = {{"running", false}, {"socket", socket.string()}};
    status["session"] = nullptr;
  }
  fmt::print(env.out, "{}", json ? status.dump() + "\n" : StatusText(status));
  return kExitOk;
}

}  // namespace

int RunCli(const std::vector<std::string>& args, const CliEnv& env) {
  if (args.empty() || args[0] == "help" || args[0] == "--help" || args[0] == "-h") {
    PrintUsage(args.empty() ? env.err : env.out);
    return args.empty() ? kExitUsage : kExitOk;
  }
  if (args[0] == "--version") {  // what help2man and people expect; `bcd version` says more
    fmt::print(env.out, "bcd {}\n", bcd::Version());
    return kExitOk;
  }
  if (args[0] == "upgrade-guard") {
    // Started by bcd itself beside a new version on trial (not listed in the help). What follows
    // "--" is the daemon's own command line, --config included: not parsed here.
    return UpgradeGuard(Flags{.rest = std::vector<std::string>(args.begin() + 1, args.end())}, env);
  }
  const Command* command = FindCommand(args[0]);
  if (command == nullptr) {
    fmt::print(env.err, "bcd: unknown command \"{}\" (see bcd --help)\n", args[0]);
    return kExitUsage;
  }
  std::optional<Flags> flags =
      ParseFlags(std::span<const std::string>(args).subspan(1), command->name, env.err);
  if (!flags) return kExitUsage;
  if (flags->help) {
    fmt::print(env.out, "usage: bcd {} [--config PATH] {}\n{}\n", command->name, command->usage,
               command->summary);
    return kExitOk;
  }
  if (command->name == "join") return Join(*std::move(flags), env);
  if (command->name == "node") return RunMode(*flags, env, proto::Mode::kNode);
  if (command->name == "status") return Status(*std::move(flags), env);
  if (command->name == "site") return RunMode(*flags, env, proto::Mode::kSite);
  if (command->name == "ramdisk") return RunMode(*flags, env, proto::Mode::kRamdisk);
  if (command->name == "install-script") return InstallScript(*flags, env);
  if (command->name == "upgrade-recover") return UpgradeRecover(*flags, env);
  if (!command->arrives.empty()) {
    fmt::print(env.err, "bcd {}: not implemented yet in this build (comes with {})\n",
               command->name, command->arrives);
    return kExitOther;
  }
  bool json = command->name == "version" && std::erase(flags->rest, "--json") > 0;
  if (!flags->rest.empty()) {
    fmt::print(env.err, "bcd {}: unknown option \"{}\"\n", command->name, flags->rest.front());
    return kExitUsage;
  }
  std::optional<Config> config = LoadConfig(*flags, env);
  if (!config) return kExitUsage;
  if (command->name == "version") return Version(*config, json, env);
  return Inventory(env);
}

}  // namespace bcd
