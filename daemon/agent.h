#pragma once

// The agent: the engine every mode runs on. The identity from the state dir, the transport
// ([websocket] url moves it from gRPC to the WebSocket, signed intent only), the session engine,
// delivery, dispatch, desired state, secrets and tunnels, wired together; the mode (daemon/mode.h)
// adds its handlers, sections and servers. It knows no mode. main() adds signals; tests drive it
// directly.

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/mutex.h"
#include "config/config.h"
#include "daemon/delivery/results.h"
#include "daemon/identity/identity.h"
#include "daemon/identity/renew.h"
#include "daemon/mode.h"
#include "daemon/session/session.h"
#include "proto/kinds.h"
#include "transport/grpc_transport.h"
#include "transport/proxy.h"

namespace bcd {
namespace upgrade {
class Upgrader;
}

struct AgentEnv {
  UnixClock now;
  std::function<double()> uniform01;
  Logger* log = nullptr;
  std::chrono::milliseconds status_interval = std::chrono::minutes(5);
  std::chrono::milliseconds keepalive_time = std::chrono::seconds(20);
  std::chrono::milliseconds keepalive_timeout = std::chrono::seconds(20);
  std::chrono::milliseconds welcome_timeout = std::chrono::seconds(30);
  std::size_t outbox_max_entries = 100000;
  // https_proxy / no_proxy for the WebSocket transport (tests pass their own).
  transport::EnvLookup proxy_env = transport::ProcessEnv;
  // How often the liveness check probes the engine's locks (Liveness).
  std::chrono::milliseconds liveness_period = std::chrono::seconds(5);
  // The installed binary this process runs, which daemon.upgrade replaces (main reads it from
  // /proc/self/exe at start); empty: daemon.upgrade is refused (tests running the engine
  // in-process).
  std::filesystem::path binary;
  // uname's machine ("x86_64"), for the os/arch a release must be signed for.
  std::string machine;
  // The command line this process runs with, kept by an upgrade for its rollback.
  std::vector<std::string> argv;
};

// What main does once Run returns after a daemon.upgrade swapped the binary (or rolled it back):
// re-execute `binary` in place, with the upgrade guard beside it when `guard`.
struct ExecRequest {
  std::filesystem::path binary;
  std::filesystem::path state_dir;
  bool guard = false;
  std::vector<std::string> argv;  // empty: this process's command line
};

class Agent {
 public:
  // FailedPrecondition when the node has not joined; Unauthenticated when its certificate expired
  // (the message says how to re-join); DataLoss naming a corrupt state file; the mode's error when
  // it could not attach.
  static absl::StatusOr<std::unique_ptr<Agent>> Create(const Config& config,
                                                       std::unique_ptr<Mode> mode, AgentEnv env);
  // Runs the session (and renewals beside it) until Stop() or a refusal that needs a person.
  absl::Status Run();
  void Stop() { engine_->Stop(); }
  SessionSnapshot Snapshot() const { return engine_->Snapshot(); }
  bool WaitUntil(const std::function<bool(const SessionSnapshot&)>& done,
                 std::chrono::milliseconds timeout) const {
    return engine_->WaitUntil(done, timeout);
  }
  int renewals() const;
  // The applied desired state (tests read it).
  const class DesiredState& desired() const { return *desired_; }
  // The mode it runs.
  const Mode& mode() const { return *mode_; }
  // Tunnels open now.
  int tunnels_open() const;
  // Secrets and workload tokens over the session, for handlers and the metadata service.
  class SecretClient& secrets() {
    return *secrets_;
  }
  bool WaitForRenewals(int count, std::chrono::milliseconds timeout) const;
  // The status `bcd status` shows (JSON, docs/operations.md names its fields): identity and
  // certificate from the state dir, the session from the engine.
  std::string StatusJson() const;
  // The same for people (what `bcd status` prints).
  std::string StatusText() const;
  // Whether the engine's threads answer (Liveness): what the systemd watchdog and /healthz read.
  absl::Status Healthy() const;
  // Whether a session is welcomed and may run commands; Unavailable saying why not.
  absl::Status Ready() const;
  // The registry every part counts in; the diagnostics listener serves it.
  Metrics& metrics() { return metrics_; }
  // The diagnostics listener's port, 0 when [diag] is not configured.
  uint16_t diag_port() const;
  // Set when Run returned to hand over to another binary (daemon.upgrade).
  std::optional<ExecRequest> exec_request() const;
  ~Agent();

 private:
  Agent() = default;
  struct Joined;  // the locked state dir, the identity in it and its trust
  static absl::StatusOr<Joined> LoadJoined(const Config& config, int64_t now);
  // The steps of Create, in order; each sets the parts it names.
  absl::Status StartTransport(const Config& config, const AgentEnv& env, const Joined& joined);
  absl::Status StartSession(const AgentEnv& env, const Mode& mode, Joined& joined);
  absl::Status StartDispatch(const AgentEnv& env, const Mode& mode, const Joined& joined);
  absl::Status StartDesiredState(const Config& config, const AgentEnv& env, const Joined& joined);
  absl::Status StartTunnels(const Config& config, const AgentEnv& env, const Mode& mode,
                            const Joined& joined);
  absl::Status AttachMode(const Config& config, const AgentEnv& env, const Joined& joined);
  // daemon.upgrade, which the engine runs whatever the mode.
  absl::Status StartUpgrades(const Config& config, const AgentEnv& env, const Joined& joined);
  // The process's and the agent's own figures, the liveness check and the diagnostics listener.
  absl::Status StartDiagnostics(const Config& config, const AgentEnv& env);

  std::optional<StateDirLock> lock_;  // first: released after everything else is closed
  Metrics metrics_;                   // outlives every part that counts in it
  std::unique_ptr<transport::Transport> transport_;
  std::unique_ptr<SessionEngine> engine_;
  std::unique_ptr<class Renewer> renewer_;
  std::unique_ptr<class ControlServer> control_;
  std::unique_ptr<Outbox> outbox_;
  std::unique_ptr<ResultStore> results_;
  std::unique_ptr<class Dispatcher> dispatcher_;
  std::unique_ptr<class DesiredState> desired_;
  std::unique_ptr<class SecretClient> secrets_;
  std::unique_ptr<class TunnelRunner> tunnels_;
  std::unique_ptr<Mode> mode_;  // detached before the parts above go away
  std::unique_ptr<class Liveness> liveness_;
  std::unique_ptr<class DiagServer> diag_;       // stopped first
  class upgrade::Upgrader* upgrader_ = nullptr;  // owned by the dispatcher
  mutable Mutex exec_mu_;
  std::optional<ExecRequest> exec_ ABSL_GUARDED_BY(exec_mu_);
  std::atomic<int64_t> certificate_not_after_{0};  // of the current certificate
  Mutex key_mu_;
  std::optional<pki::PrivateKey> node_key_ ABSL_GUARDED_BY(key_mu_);  // replaced at each renewal
  std::vector<std::string> node_chain_der_ ABSL_GUARDED_BY(key_mu_);  // the key's chain, leaf first
  std::filesystem::path state_dir_;
  std::filesystem::path upgrader_binary_;  // AgentEnv::binary
  std::string transport_name_ = "grpc";    // or "websocket"
  UnixClock now_;
  Logger* log_ = nullptr;
};

}  // namespace bcd
