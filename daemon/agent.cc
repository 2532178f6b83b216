#include "daemon/agent.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_join.h"
#include "base/files.h"
#include "base/mutex.h"
#include "base/version.h"
#include "daemon/control.h"
#include "daemon/diag.h"
#include "daemon/dispatch/desired.h"
#include "daemon/dispatch/dispatcher.h"
#include "daemon/identity/gateway.h"
#include "daemon/identity/identity.h"
#include "daemon/identity/renew.h"
#include "daemon/liveness.h"
#include "daemon/secrets/secrets.h"
#include "daemon/tunnels/tunnels.h"
#include "daemon/upgrade/upgrader.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "pki/envelope.h"
#include "pki/jwt.h"
#include "proto/absl_compat.h"

namespace bcd {

using bettercompute::agent::v1::NodeSpec;

namespace {

std::vector<std::string> ChainDer(const std::vector<pki::Certificate>& chain) {
  std::vector<std::string> der;
  der.reserve(chain.size());
  for (const pki::Certificate& certificate : chain) der.push_back(certificate.Der());
  return der;
}

// The daemon section: log level and StatusReport period now; desired_version is acted on by the
// daemon.upgrade command, which brings the binary, so here it is only compared.
absl::Status ApplyDaemonSection(const bettercompute::agent::v1::DaemonSection& section, Logger* log,
                                SessionEngine* engine, std::chrono::milliseconds default_interval) {
  std::optional<LogLevel> level;
  for (LogLevel l : {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarn, LogLevel::kError}) {
    if (section.log_level() == LogLevelName(l)) level = l;
  }
  if (!section.log_level().empty() && !level) {
    return absl::InvalidArgumentError(fmt::format(
        "log_level \"{}\" is not one of debug, info, warn, error", section.log_level()));
  }
  uint32_t interval = section.status_interval_seconds();
  if (interval != 0 && (interval < 10 || interval > 86400)) {
    return absl::InvalidArgumentError(fmt::format("status_interval_seconds {} is outside 10..86400",
                                                  section.status_interval_seconds()));
  }
  if (level && log != nullptr) log->set_level(*level);
  engine->set_status_interval(interval != 0 ? std::chrono::seconds(interval) : default_interval);
  if (!section.desired_version().empty() && section.desired_version() != Version()) {
    return absl::FailedPreconditionError(
        fmt::format("desired_version {} differs from this daemon's {}: it comes with a "
                    "daemon.upgrade command",
                    section.desired_version(), Version()));
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> EngineCapabilities(bool websocket) {
  std::vector<std::string> capabilities;
  if (!websocket) capabilities = {"tunnel.shell", "tunnel.exec", "tunnel.tcp"};
  // Secrets ride either transport; the daemon and access sections are applied whole.
  capabilities.push_back("secrets.jwe");
  capabilities.push_back("spec.daemon");
  capabilities.push_back("spec.access");
  return capabilities;
}

std::vector<std::string> AllCapabilities(const Mode& mode, bool websocket) {
  std::vector<std::string> capabilities = EngineCapabilities(websocket);
  for (std::string& capability : mode.Capabilities(websocket)) {
    capabilities.push_back(std::move(capability));
  }
  return capabilities;
}

std::vector<std::string> EngineConfigSections() {
  return {"websocket", "update", "tunnels", "diag"};
}

std::vector<std::string> UnreadConfigSections(const Config& config, const Mode& mode) {
  std::vector<std::string> read = EngineConfigSections();
  for (std::string& section : mode.ConfigSections()) read.push_back(std::move(section));
  std::vector<std::string> unread;
  for (const std::string& section : config.sections()) {
    if (std::find(read.begin(), read.end(), section) == read.end()) unread.push_back(section);
  }
  return unread;
}

// What a daemon starts from: the locked state dir, the identity in it and its trust.
struct Agent::Joined {
  StateDir dir;
  StateDirLock lock;
  Identity identity;
  pki::TrustState trust;
};

// The state dir locked (one daemon per state dir, decided before anything in it is opened), the
// identity loaded, its certificate still valid and its trust bundle readable.
absl::StatusOr<Agent::Joined> Agent::LoadJoined(const Config& config, int64_t now) {
  if (!config.gateway_url() || !config.gateway_ca_spki_sha256()) {
    return absl::InvalidArgumentError(config.source() +
                                      ": needs gateway_url and gateway_ca_spki_sha256");
  }
  if (absl::Status s = transport::RequireTls13(); !s.ok()) return s;
  absl::StatusOr<StateDir> state = StateDir::Open(config.state_dir());
  if (!state.ok()) return state.status();
  absl::StatusOr<StateDirLock> lock = state->Lock();
  if (!lock.ok()) return lock.status();
  if (!state->HasIdentity()) {
    return absl::FailedPreconditionError(
        fmt::format("this node has not joined (no identity in {}): run bcd join first",
                    state->path().string()));
  }
  absl::StatusOr<Identity> identity = state->LoadIdentity();
  if (!identity.ok()) return identity.status();
  int64_t not_after = identity->chain.front().NotAfter();
  if (not_after <= now) {
    return absl::UnauthenticatedError(
        fmt::format("the node certificate expired at {} (unix time): it can no longer renew. "
                    "Re-join: remove the "
                    "identity in {} and run bcd join with a new token, or bcd join --node-id on a "
                    "provisioned machine",
                    not_after, state->path().string()));
  }
  absl::StatusOr<pki::TrustState> trust = TrustOf(*identity);
  if (!trust.ok()) {
    return absl::DataLossError(
        fmt::format("{}: {}", state->TrustBundlePath().string(), ToStd(trust.status().message())));
  }
  return Joined{*std::move(state), *std::move(lock), *std::move(identity), *std::move(trust)};
}

namespace {

// The WebSocket session carries signed intent only: without roots to verify it, nothing the
// gateway sent could be run, and the proxy in the middle could not be told from the gateway.
absl::Status RequireSigningRoots(const Config& config, const pki::TrustState& trust) {
  if (!trust.command_signing_roots().empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(fmt::format(
      "[websocket] in {}: the trust bundle (version {}) has no command-signing roots, and a "
      "WebSocket session takes signed commands and specs only; turn command signing on in "
      "the control plane, or remove [websocket] to use gRPC",
      config.source(), trust.version()));
}

std::string BootId() {
  absl::StatusOr<std::string> id = ReadWholeFile("/proc/sys/kernel/random/boot_id", 256);
  return id.ok() ? id->substr(0, id->find('\n')) : "";
}

}  // namespace

absl::Status Agent::StartTransport(const Config& config, const AgentEnv& env,
                                   const Joined& joined) {
  transport::ChannelSpec spec = GatewayChannel(config, env.now);
  spec.keepalive_time = env.keepalive_time;
  spec.keepalive_timeout = env.keepalive_timeout;
  StateDir dir = joined.dir;
  if (!config.websocket()) {
    transport_name_ = "grpc";
    transport_ = std::make_unique<transport::GrpcTransport>(
        spec, [dir]() -> absl::StatusOr<transport::ClientIdentity> {
          // Re-read at every dial: a renewal takes effect on the next one.
          absl::StatusOr<Identity> identity = dir.LoadIdentity();
          if (!identity.ok()) return identity.status();
          std::string chain;
          for (const pki::Certificate& cert : identity->chain) chain += cert.Pem();
          return transport::ClientIdentity{identity->key.ToPem(), chain};
        });
    return absl::OkStatus();
  }
  if (absl::Status s = RequireSigningRoots(config, joined.trust); !s.ok()) return s;
  absl::StatusOr<transport::WebSocketSpec> ws = WebSocketChannel(config, env.now);
  if (!ws.ok()) return ws.status();
  ws->keepalive_time = env.keepalive_time;
  ws->keepalive_timeout = env.keepalive_timeout;
  ws->env = env.proxy_env;
  pki::PublicKey join_service_key = joined.identity.join_service_key;
  transport_name_ = "websocket";
  transport_ = std::make_unique<transport::WebSocketTransport>(
      *ws, [dir, join_service_key]() -> absl::StatusOr<transport::WsNodeIdentity> {
        // Re-read at every dial: a renewal takes effect on the next one, and a trust bundle
        // that dropped the signing roots stops the dialing.
        absl::StatusOr<Identity> identity = dir.LoadIdentity();
        if (!identity.ok()) return identity.status();
        identity->join_service_key = join_service_key;  // the key pinned when bcd started
        absl::StatusOr<pki::TrustState> trust = TrustOf(*identity);
        if (trust.ok() && trust->command_signing_roots().empty()) {
          return absl::FailedPreconditionError(
              "the trust bundle has no command-signing roots: the WebSocket session is not "
              "dialed");
        }
        return transport::WsNodeIdentity{identity->key, identity->chain, identity->node.id.node()};
      });
  return absl::OkStatus();
}

absl::Status Agent::StartSession(const AgentEnv& env, const Mode& mode, Joined& joined) {
  bool websocket = transport_name_ == "websocket";
  StateDir dir = joined.dir;
  SessionOptions options{
      .role = mode.role(),
      .capabilities = AllCapabilities(mode, websocket),
      .now = env.now,
      .uniform01 = env.uniform01,
      .status_interval = env.status_interval,
      .signed_only = websocket,
      .tunnels = !websocket,
      .boot_id = BootId(),
      .started_at = env.now(),
      .certificate_not_after = joined.identity.chain.front().NotAfter(),
      .on_trust =
          [dir, log = env.log](const pki::TrustState& trust) {
            if (absl::Status s = dir.SaveTrust(trust); !s.ok() && log) {
              log->Warn("trust.persist_failed", {{"error", std::string(ToStd(s.message()))}});
            }
          },
      .welcome_timeout = env.welcome_timeout,
      .metrics = &metrics_};
  absl::StatusOr<Outbox> outbox = Outbox::Open(dir.path(), {.max_entries = env.outbox_max_entries});
  if (!outbox.ok()) return outbox.status();
  outbox_ = std::make_unique<Outbox>(*std::move(outbox));
  {
    MutexLock lock(key_mu_);
    node_key_ = joined.identity.key;
    node_chain_der_ = ChainDer(joined.identity.chain);
  }
  certificate_not_after_ = joined.identity.chain.front().NotAfter();
  renewer_ = std::make_unique<Renewer>(
      RenewThrough(transport_.get()), dir, joined.trust.node_cas(), env.now, env.uniform01, env.log,
      [this](const Identity& renewed) {
        {
          MutexLock lock(key_mu_);
          node_key_ = renewed.key;  // requests sign with the key of the current certificate
          node_chain_der_ = ChainDer(renewed.chain);
        }
        certificate_not_after_ = renewed.chain.front().NotAfter();
        (void)engine_->Emit(bettercompute::agent::v1::SEVERITY_INFO, "identity.renewed",
                            "the node certificate was renewed",
                            {{"generation", std::to_string(renewed.node.generation.value_or(0))},
                             {"not_after", std::to_string(renewed.chain.front().NotAfter())}});
      });
  renewer_->set_metrics(&metrics_);
  engine_ = std::make_unique<SessionEngine>(transport_.get(), std::move(joined.trust),
                                            joined.identity.join_service_key, std::move(options),
                                            outbox_.get(), env.log);
  return absl::OkStatus();
}

absl::Status Agent::StartDispatch(const AgentEnv& env, const Mode& mode, const Joined& joined) {
  absl::StatusOr<ResultStore> results = ResultStore::Open(joined.dir.path(), env.now());
  if (!results.ok()) return results.status();
  results_ = std::make_unique<ResultStore>(*std::move(results));
  dispatcher_ = std::make_unique<Dispatcher>(
      mode.id(), joined.identity.node.id.node(), results_.get(),
      DispatcherHooks{.update =
                          [this](const bettercompute::agent::v1::CommandUpdate& update) {
                            (void)engine_->EmitUpdate(update);
                          },
                      .terminal =
                          [this](const bettercompute::agent::v1::CommandUpdate& update,
                                 const std::function<void()>& remember) {
                            (void)engine_->EmitUpdate(update, remember);
                          },
                      .now = env.now,
                      .event =
                          [this](const std::string& kind, const std::string& message) {
                            (void)engine_->Emit(bettercompute::agent::v1::SEVERITY_ERROR, kind,
                                                message);
                          },
                      .metrics = &metrics_},
      env.log);
  engine_->set_dispatcher(dispatcher_.get());
  secrets_ = std::make_unique<SecretClient>(
      SecretClientOptions{.send =
                              [this](const bettercompute::agent::v1::AgentFrame& frame) {
                                return engine_->Send(frame);
                              },
                          .node_key = [this]() -> absl::StatusOr<pki::PrivateKey> {
                            MutexLock lock(key_mu_);
                            return *node_key_;
                          },
                          .now = env.now,
                          .metrics = &metrics_},
      env.log);
  engine_->set_secrets(secrets_.get());
  return absl::OkStatus();
}

absl::Status Agent::StartUpgrades(const Config& config, const AgentEnv& env, const Joined& joined) {
  auto upgrader = std::make_unique<upgrade::Upgrader>(upgrade::UpgraderOptions{
      .layout = {.binary = env.binary, .state_dir = joined.dir.path()},
      .pins = config.release_keys(),
      .os_arch = upgrade::OsArch(env.machine),
      .running = std::string(Version()),
      .limits = config.update(),
      .download = [](const DownloadRequest& request) { return HttpGetToFile(request); },
      .now = env.now,
      .log = env.log,
      .restart =
          [this](bool guard, const std::filesystem::path& binary,
                 const std::vector<std::string>& argv) {
            {
              MutexLock lock(exec_mu_);
              exec_ = ExecRequest{
                  .binary = binary, .state_dir = state_dir_, .guard = guard, .argv = argv};
            }
            engine_->Stop();
          },
      .event =
          [this](bettercompute::agent::v1::Severity severity, const std::string& kind,
                 const std::string& message, const std::map<std::string, std::string>& attributes) {
            (void)engine_->Emit(severity, kind, message, attributes);
          },
      .resolve =
          [this](const bettercompute::agent::v1::CommandUpdate& update) {
            dispatcher_->Resolve(update);
          },
      .welcomed =
          [this](std::chrono::milliseconds timeout) {
            return engine_->WaitUntil(
                [](const SessionSnapshot& s) { return s.state == "connected" && s.welcomes > 0; },
                timeout);
          },
      .last_error = [this] { return engine_->Snapshot().last_error; },
      .argv = env.argv});
  upgrader_binary_ = env.binary;
  upgrader_ = upgrader.get();
  return dispatcher_->Register("daemon.upgrade", std::move(upgrader));
}

absl::Status Agent::StartDesiredState(const Config& config, const AgentEnv& env,
                                      const Joined& joined) {
  absl::StatusOr<std::unique_ptr<DesiredState>> desired =
      DesiredState::Open(joined.dir.path(), joined.identity.node.id.node(), env.log);
  if (!desired.ok()) return desired.status();
  desired_ = *std::move(desired);
  desired_->Register("daemon",
                     [this, log = env.log, interval = env.status_interval](const NodeSpec& spec) {
                       return ApplyDaemonSection(spec.daemon(), log, engine_.get(), interval);
                     });
  desired_->Register("access", [max = config.max_tunnels()](const NodeSpec& spec) {
    // Kept by DesiredState; every OpenTunnel checks the section again and obeys all of it (keys,
    // allowed_ops, max_tunnels), and opens nothing while it is invalid.
    return TunnelAccess::FromSection(spec.access(), max).status();
  });
  return absl::OkStatus();
}

absl::Status Agent::StartTunnels(const Config& config, const AgentEnv& env, const Mode& mode,
                                 const Joined& joined) {
  absl::StatusOr<std::unique_ptr<TunnelRunner>> tunnels = TunnelRunner::Create(
      {.node_id = joined.identity.node.id.node(),
       .max = config.max_tunnels(),
       .state_dir = joined.dir.path(),
       .access = [this] { return desired_->access(); },
       .now = env.now,
       .user = config.tunnel_user(),
       .allow = config.tunnel_allow(),
       .instance_dial = mode.instance_dial(),
       .instance_address = [this](const std::string& id) -> std::optional<std::string> {
         return mode_->InstanceAddress(id);
       },
       .event =
           [this](const std::string& kind, const std::string& message,
                  const std::map<std::string, std::string>& attributes) {
             (void)engine_->Emit(bettercompute::agent::v1::SEVERITY_WARNING, kind, message,
                                 attributes);
           },
       .metrics = &metrics_},
      env.log);
  if (!tunnels.ok()) return tunnels.status();
  tunnels_ = *std::move(tunnels);
  engine_->set_tunnels(tunnels_.get());
  return absl::OkStatus();
}

absl::Status Agent::AttachMode(const Config& config, const AgentEnv& env, const Joined& joined) {
  ModeContext context{
      .config = &config,
      .node_id = joined.identity.node.id.node(),
      .site = joined.identity.node.id.site(),
      .sign = [this, kid = joined.identity.node.id.ToString()](std::string_view signing_input)
          -> absl::StatusOr<bettercompute::common::v1::Signature> {
        MutexLock lock(key_mu_);
        return pki::Sign(signing_input, *node_key_, kid, node_chain_der_);
      },
      .state_dir = joined.dir.path(),
      .websocket = transport_name_ == "websocket",
      .dispatcher = dispatcher_.get(),
      .desired = desired_.get(),
      .secrets = secrets_.get(),
      .engine = engine_.get(),
      .now = env.now,
      .log = env.log,
      .metrics = &metrics_};
  if (absl::Status s = mode_->Attach(context); !s.ok()) return s;
  for (const std::string& section : UnreadConfigSections(config, *mode_)) {
    env.log->Warn("config.section_unused", {{"section", section},
                                            {"mode", std::string(proto::ModeName(mode_->id()))},
                                            {"source", config.source()}});
  }
  // Kinds the table gives this mode that this build cannot run yet: said once at start, and each
  // such command is refused saying so.
  if (std::vector<std::string> unhandled = dispatcher_->Unhandled(); !unhandled.empty()) {
    env.log->Info("kinds.not_yet", {{"mode", std::string(proto::ModeName(mode_->id()))},
                                    {"kinds", absl::StrJoin(unhandled, ",")}});
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Agent>> Agent::Create(const Config& config,
                                                     std::unique_ptr<Mode> mode, AgentEnv env) {
  absl::StatusOr<Joined> joined = LoadJoined(config, env.now());
  if (!joined.ok()) return joined.status();
  std::unique_ptr<Agent> agent(new Agent());
  agent->lock_.emplace(std::move(joined->lock));
  agent->state_dir_ = joined->dir.path();
  agent->log_ = env.log;
  agent->now_ = env.now;
  if (absl::Status s = agent->StartTransport(config, env, *joined); !s.ok()) return s;
  if (absl::Status s = agent->StartSession(env, *mode, *joined); !s.ok()) {
    return s;
  }
  if (absl::Status s = agent->StartDispatch(env, *mode, *joined); !s.ok()) return s;
  if (absl::Status s = agent->StartDesiredState(config, env, *joined); !s.ok()) return s;
  if (absl::Status s = agent->StartUpgrades(config, env, *joined); !s.ok()) return s;
  if (!config.websocket()) {  // tunnels ride gRPC only
    if (absl::Status s = agent->StartTunnels(config, env, *mode, *joined); !s.ok()) return s;
  }
  agent->mode_ = std::move(mode);
  if (absl::Status s = agent->AttachMode(config, env, *joined); !s.ok()) return s;
  agent->desired_->Reapply();
  agent->engine_->set_desired(agent->desired_.get());
  absl::StatusOr<std::unique_ptr<ControlServer>> control = ControlServer::Start(
      agent->state_dir_ / "bcd.sock", [a = agent.get()] { return a->StatusJson(); });
  if (!control.ok()) return control.status();
  agent->control_ = *std::move(control);
  if (absl::Status s = agent->StartDiagnostics(config, env); !s.ok()) return s;
  return agent;
}

absl::Status Agent::StartDiagnostics(const Config& config, const AgentEnv& env) {
  AddProcessMetrics(metrics_);
  metrics_.Collect("bcd_fsyncs_total", "fsync and fdatasync calls made", MetricType::kCounter, {},
                   [] {
                     return std::vector<Sample>{{{}, static_cast<double>(SyncCount())}};
                   });
  metrics_
      .Gauge("bcd_build_info", "1, labelled with the version and mode running", {"version", "mode"})
      .Set({Version(), proto::ModeName(mode_->id())}, 1);
  metrics_.Collect("bcd_certificate_seconds_left",
                   "Seconds until the node certificate expires (negative once it has)",
                   MetricType::kGauge, {}, [this] {
                     return std::vector<Sample>{
                         {{}, static_cast<double>(certificate_not_after_.load() - now_())}};
                   });
  // The probe takes the lock of every part whose threads share one: a lock held forever stalls it.
  liveness_ = std::make_unique<Liveness>(
      [this] {
        (void)engine_->Snapshot();
        (void)dispatcher_->InHand();
        (void)secrets_->unmatched();
        if (tunnels_) (void)tunnels_->active();
      },
      env.liveness_period);
  if (!config.diag_listen()) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<DiagServer>> diag =
      DiagServer::Start({.listen = *config.diag_listen(),
                         .metrics = [this] { return metrics_.Text(); },
                         .healthy = [this] { return Healthy(); },
                         .ready = [this] { return Ready(); }},
                        log_);
  if (!diag.ok()) return diag.status();
  diag_ = *std::move(diag);
  return absl::OkStatus();
}

Agent::~Agent() {
  diag_.reset();  // nothing asks the parts below for figures any more
  liveness_.reset();
  if (upgrader_ != nullptr) upgrader_->Stop();
  dispatcher_.reset();  // its lanes report through the engine: stop them first
  if (mode_) mode_->Detach();
}

absl::Status Agent::Healthy() const { return liveness_->Check(); }

uint16_t Agent::diag_port() const { return diag_ ? diag_->port() : 0; }

std::optional<ExecRequest> Agent::exec_request() const {
  MutexLock lock(exec_mu_);
  return exec_;
}

absl::Status Agent::Ready() const {
  SessionSnapshot s = engine_->Snapshot();
  if (s.state != "connected") {
    return absl::UnavailableError(
        fmt::format("no session: {}{}", s.state, s.last_error.empty() ? "" : ": " + s.last_error));
  }
  if (s.upgrade_required) {
    return absl::UnavailableError(fmt::format(
        "session {} is up, but the gateway requires an upgrade: only daemon.upgrade runs",
        s.session_id));
  }
  return absl::OkStatus();
}

std::string Agent::StatusJson() const {
  absl::StatusOr<nlohmann::json> status = StateDirStatus(state_dir_, now_());
  nlohmann::json doc =
      status.ok() ? *status
                  : nlohmann::json{{"version", Version()},
                                   {"state_dir", state_dir_.string()},
                                   {"node", {{"error", ToStd(status.status().message())}}}};
  doc["upgrade"] = upgrade::UpgradeStatus({.binary = upgrader_binary_, .state_dir = state_dir_});
  doc["daemon"] = {{"running", true},          {"mode", proto::ModeName(mode_->id())},
                   {"pid", getpid()},          {"socket", (state_dir_ / "bcd.sock").string()},
                   {"diag_port", diag_port()}, {"healthy", Healthy().ok()}};
  SessionSnapshot s = engine_->Snapshot();
  doc["session"] = {{"state", s.state},
                    {"transport", transport_name_},
                    {"session_id", s.session_id},
                    {"protocol_version", s.protocol_version},
                    {"upgrade_required", s.upgrade_required},
                    {"last_error", s.last_error},
                    {"welcomes", s.welcomes},
                    {"outbox_pending", s.outbox_pending},
                    {"last_acked_seq", s.last_acked_seq}};
  return doc.dump() + "\n";
}

std::string Agent::StatusText() const {
  return bcd::StatusText(nlohmann::json::parse(StatusJson()));
}

absl::Status Agent::Run() {
  // A command whose terminal update reached the outbox just before a crash finished: record it,
  // so it is not reported interrupted as well.
  if (absl::StatusOr<int> found = results_->Reconcile(outbox_->pending(), now_()); !found.ok()) {
    return found.status();
  }
  // An upgrade under way: the new version on trial claims its command; a rollback hands over to the
  // restored binary before anything dials.
  absl::StatusOr<upgrade::Upgrader::Resumed> resumed = upgrader_->Resume();
  if (!resumed.ok()) {
    log_->Error("upgrade.resume_failed",
                {{"error", std::string(ToStd(resumed.status().message()))}});
    resumed = upgrade::Upgrader::Resumed{};
  }
  if (resumed->restart) {
    MutexLock lock(exec_mu_);
    exec_ = ExecRequest{
        .binary = resumed->binary, .state_dir = state_dir_, .guard = false, .argv = resumed->argv};
    return absl::OkStatus();
  }
  std::set<std::string> claimed;
  if (resumed->claimed) claimed.insert(*resumed->claimed);
  dispatcher_->ReportInterrupted(claimed);
  renewer_->Start();
  absl::Status status = engine_->Run();
  renewer_->Stop();
  return status;
}

int Agent::renewals() const { return renewer_->renewals(); }

int Agent::tunnels_open() const { return tunnels_ ? tunnels_->active() : 0; }

bool Agent::WaitForRenewals(int count, std::chrono::milliseconds timeout) const {
  return renewer_->WaitForRenewals(count, timeout);
}

}  // namespace bcd
