#pragma once

// The tunnel runner: an OpenTunnel on the session becomes a Tunnel stream on the same connection,
// once its ticket checks out again here (ES256 against the access section's JWKS, aud node:<id>,
// at most 60 s, sid = this session, tid = the tunnel id), its op is one the access section allows,
// and its jti was never used (persisted).
// A refused ticket opens nothing (the gateway's open times out); the reason goes to the log and a
// `tunnel.refused` event, never the ticket itself.
//
// Ops, each on its own thread, as the configured user ([tunnels] user; bcd's own when unset):
//   shell         a login shell on a PTY, `resize` honoured, the PTY on channel 0
//   exec          argv from the ticket: stdin and stdout on channel 0, stderr on 1, exit code in
//                 `closed`; an empty data frame on channel 0 closes stdin
//   tcp           a byte stream to host:port when [tunnels] allow lets it (default: loopback);
//                 an empty data frame half-closes it
//   instance-tcp  the same to a port of an instance the desired state's vps section lists
// Flow control is end to end: one 32 KiB buffer per direction, blocking writes on both sides, so a
// reader that stops makes bcd stop reading instead of buffering. Closing either side ends the
// other, and the process group (or socket) goes with it. At most [tunnels] max (16) at once.

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/mutex.h"
#include "bettercompute/agent/v1/spec.pb.h"
#include "config/config.h"
#include "pki/jwt.h"
#include "transport/transport.h"

namespace bcd {

namespace tunnels {
struct Tunnel;
class TunnelOp;
}  // namespace tunnels

// What the desired state's access section allows, checked: the keys tickets are verified against,
// the ops (an empty allowed_ops allows none), and how many tunnels at once (the smaller of
// [tunnels] max and the section's max_tunnels; 0 there takes the config's).
struct TunnelAccess {
  std::string jwks;
  std::set<std::string> ops;
  uint32_t max = 0;
  // InvalidArgument naming the field for an op bcd does not know, a max_tunnels above 16, or a
  // JWKS with an unusable key: such a section is not applied (and no tunnel opens).
  static absl::StatusOr<TunnelAccess> FromSection(
      const bettercompute::agent::v1::AccessSection& section, uint32_t config_max);
};

struct TunnelRunnerOptions {
  std::string node_id;
  uint32_t max = kMaxTunnels;       // [tunnels] max
  std::filesystem::path state_dir;  // holds the jti set (tunnel-jti)
  // The access section of the applied desired state (empty when none).
  std::function<bettercompute::agent::v1::AccessSection()> access;
  UnixClock now;                       // unix seconds
  std::string user;                    // shell and exec log in as this user; "" = bcd's own
  std::vector<TunnelAllowRule> allow;  // where tcp may go
  // instance-tcp (only where the mode advertises tunnel.instance-dial): the address of an instance
  // of the vps section, nullopt when it has none.
  bool instance_dial = false;
  std::function<std::optional<std::string>(const std::string& instance)> instance_address;
  // A warning event for the gateway (kind, message, attributes).
  std::function<void(const std::string&, const std::string&,
                     const std::map<std::string, std::string>&)>
      event;
  // Where tunnels are counted (open now, opened by op, refused, bytes each way); a registry of the
  // runner's own when null. Outlives the runner.
  Metrics* metrics = nullptr;
};

class TunnelRunner {
 public:
  // DataLoss naming the jti file when it is corrupt.
  static absl::StatusOr<std::unique_ptr<TunnelRunner>> Create(TunnelRunnerOptions options,
                                                              Logger* log);
  ~TunnelRunner();

  // From the session's thread: checks the ticket and starts the tunnel on `session`'s connection.
  // An error is the refusal (already logged and reported); nothing was opened.
  absl::Status Open(const bettercompute::agent::v1::OpenTunnel& open,
                    transport::FrameStream& session, const std::string& session_id);
  // The session ended: every tunnel ends, its processes and sockets with it. Blocks until they
  // have.
  void CloseAll();
  // Tunnels open now.
  int active() const;

 private:
  TunnelRunner(TunnelRunnerOptions options, Logger* log, pki::JtiSet jti);
  struct Figures;  // tunnels.cc
  class CountedStream;
  absl::Status Refuse(const std::string& tunnel_id, std::string why);
  // Checks the ticket against the access section, the limit and the jti set (recording its jti);
  // the op to run, or the refusal.
  absl::StatusOr<std::unique_ptr<tunnels::TunnelOp>> Admit(
      const bettercompute::agent::v1::OpenTunnel& open, const std::string& session_id,
      std::optional<pki::TunnelTicket>* ticket);
  // The tunnel's thread: opened, the op, closed.
  void Run(tunnels::Tunnel& tunnel, std::unique_ptr<tunnels::TunnelOp> op);
  void Reap() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);  // joins tunnels that ended

  TunnelRunnerOptions options_;
  std::unique_ptr<Metrics> own_metrics_;  // when the options gave none
  std::unique_ptr<Figures> figures_;
  Logger* log_;
  mutable Mutex mu_;
  pki::JtiSet jti_ ABSL_GUARDED_BY(mu_);
  std::list<std::shared_ptr<tunnels::Tunnel>> tunnels_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bcd
