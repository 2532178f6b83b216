#pragma once

// A running mode (node, site): the identity from the state dir, the transport ([websocket] url
// moves it from gRPC to the WebSocket, signed intent only) and the session engine, wired together.
// main() adds signals; tests drive it directly.

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/config.h"
#include "daemon/identity.h"
#include "daemon/inventory.h"
#include "daemon/log.h"
#include "daemon/results.h"
#include "daemon/session.h"
#include "proto/kinds.h"
#include "transport/grpc_transport.h"
#include "transport/proxy.h"

namespace bcd {

// What Hello advertises in `mode`: the tunnel ops over gRPC (and instance-dial in node mode);
// nothing over the WebSocket, which refuses tunnels.
std::vector<std::string> ModeCapabilities(proto::Mode mode, bool websocket);

struct NodeDaemonEnv {
  InventorySources inventory;  // what inventory.refresh reads (root, architecture, runner)
  std::function<int64_t()> now;
  std::function<double()> uniform01;
  Logger* log = nullptr;
  std::chrono::milliseconds status_interval = std::chrono::minutes(5);
  std::chrono::milliseconds keepalive_time = std::chrono::seconds(20);
  std::chrono::milliseconds keepalive_timeout = std::chrono::seconds(20);
  std::chrono::milliseconds welcome_timeout = std::chrono::seconds(30);
  std::size_t outbox_max_entries = 100000;
  // How long node.reboot waits for its result to reach the gateway before rebooting anyway.
  std::chrono::milliseconds reboot_result_wait = std::chrono::seconds(30);
  // Programs logs.collect runs (tests point them at scripts).
  std::string journalctl = "journalctl";
  std::string dmesg = "dmesg";
  // https_proxy / no_proxy for the WebSocket transport (tests pass their own).
  transport::EnvLookup proxy_env = transport::ProcessEnv;
};

class NodeDaemon {
 public:
  // FailedPrecondition when the node has not joined; Unauthenticated when its certificate expired
  // (the message says how to re-join); DataLoss naming a corrupt state file.
  static absl::StatusOr<std::unique_ptr<NodeDaemon>> Create(const Config& config, proto::Mode mode,
                                                            NodeDaemonEnv env);
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
  // The metadata service's port, 0 when it does not run.
  uint16_t imds_port() const;
  // Tunnels open now.
  int tunnels_open() const;
  // Secrets and workload tokens over the session, for handlers and the metadata service.
  class SecretClient& secrets() {
    return *secrets_;
  }
  bool WaitForRenewals(int count, std::chrono::milliseconds timeout) const;
  // The status as `bcd status` prints it: identity and certificate from the state dir, the session
  // from the engine.
  std::string StatusText() const;
  ~NodeDaemon();

 private:
  NodeDaemon() = default;
  std::optional<StateDirLock> lock_;  // first: released after everything else is closed
  std::unique_ptr<transport::Transport> transport_;
  std::unique_ptr<SessionEngine> engine_;
  std::unique_ptr<class Renewer> renewer_;
  std::unique_ptr<class ControlServer> control_;
  std::unique_ptr<Outbox> outbox_;
  std::unique_ptr<ResultStore> results_;
  std::unique_ptr<class Dispatcher> dispatcher_;
  std::unique_ptr<class DesiredState> desired_;
  std::unique_ptr<class SecretClient> secrets_;
  std::unique_ptr<class ImdsServer> imds_;
  std::unique_ptr<class TunnelRunner> tunnels_;
  std::mutex key_mu_;
  std::optional<pki::PrivateKey> node_key_;  // guarded by key_mu_; replaced at each renewal
  // node.reboot: waits out the delay and for the outbox to drain, then runs the reboot command;
  // returns the unix time it is due. While one is due, another request is that one.
  int64_t ScheduleReboot(std::chrono::seconds delay, std::string reason, std::string command_id);
  std::vector<std::string> reboot_command_;
  std::chrono::milliseconds reboot_result_wait_{std::chrono::seconds(30)};
  std::mutex reboot_mu_;
  std::condition_variable reboot_cv_;
  bool stopping_ = false;              // guarded by reboot_mu_
  std::optional<int64_t> reboot_due_;  // guarded by reboot_mu_: set while a reboot waits
  std::thread reboot_;                 // guarded by reboot_mu_
  std::filesystem::path state_dir_;
  std::string transport_name_ = "grpc";  // or "websocket"
  std::function<int64_t()> now_;
  Logger* log_ = nullptr;
};

}  // namespace bcd
