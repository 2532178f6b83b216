#pragma once

// One open tunnel at the node end: its Tunnel stream (the operator's side) and the op that runs
// here (a shell, an exec'd command, a TCP connection), one class per op. Internal to the tunnels
// library; tunnels.h is the interface.

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/fd.h"
#include "base/log.h"
#include "base/mutex.h"
#include "bettercompute/agent/v1/tunnel.pb.h"
#include "config/config.h"
#include "daemon/tunnels/keeper.h"
#include "pki/jwt.h"
#include "transport/transport.h"

namespace bcd::tunnels {

// The stream side of a tunnel, shared by the tunnel's thread (which runs the op and pumps its
// output) and the reader thread (which carries the operator's input to it).
struct Tunnel {
  std::string id;
  std::optional<pki::TunnelTicket> ticket;
  std::unique_ptr<transport::TunnelStream> stream;
  std::thread thread;
  std::atomic<bool> done{false};

  Mutex mu;
  CondVar cv;
  bool closing ABSL_GUARDED_BY(mu) = false;  // the operator's side ended
  bool reader_done ABSL_GUARDED_BY(mu) = false;
  pid_t keeper ABSL_GUARDED_BY(mu) = -1;  // told (SIGTERM) to end everything on close
  // The op's endpoints, borrowed (the op owns them and outlives the reader):
  int socket ABSL_GUARDED_BY(mu) = -1;  // the tcp socket to shut down on close
  int input ABSL_GUARDED_BY(mu) = -1;   // where channel 0 goes (stdin pipe, PTY, socket)
  int pty ABSL_GUARDED_BY(mu) = -1;     // for resize
  Fd stdin_pipe ABSL_GUARDED_BY(mu);    // exec's stdin, owned here: the operator's EOF closes it

  // The other side is gone or asked to close: stop what runs here.
  void Stop();
  // Starts the reader thread (once): channel 0 to `input`, resize to the PTY, closed = stop.
  // The operator's frames are read only once their destination exists: a frame read earlier
  // (stdin and its end, say) would have nowhere to go.
  void StartReader();
  // Sends what `fds` yield (channel i for fds[i]) until all reach EOF or the tunnel closes.
  void Pump(const std::vector<int>& fds);
  // Ends the stream: `closed`, then a clean end; cancelled if the gateway does not end it in 5 s.
  // Then waits for the reader.
  void Finish(const bettercompute::agent::v1::TunnelFrame& closed);

 private:
  void ReadStream();
  std::thread reader_;
};

// What runs at the node end. Run (on the tunnel's thread) starts it, gives the tunnel its
// endpoints, pumps its output into the stream until it ends or the tunnel closes, and returns the
// `closed` frame that says how it ended. The op owns its fds: they close when it is destroyed,
// after the reader is done with them.
class TunnelOp {
 public:
  virtual ~TunnelOp() = default;
  virtual bettercompute::agent::v1::TunnelFrame Run(Tunnel& tunnel) = 0;
};

// A login shell on a PTY of rows x cols.
std::unique_ptr<TunnelOp> MakeShellOp(Account account, uint32_t rows, uint32_t cols);
// argv with stdin and stdout on channel 0, stderr on 1.
std::unique_ptr<TunnelOp> MakeExecOp(Account account, std::vector<std::string> argv);
// A byte stream to host:port, when one of `allow` lets the address it resolves to (nullptr: no
// rules, for an instance address the desired state gave). `host` is an error when there is no
// address to dial (an instance the vps section does not list).
std::unique_ptr<TunnelOp> MakeTcpOp(absl::StatusOr<std::string> host, uint16_t port,
                                    const std::vector<TunnelAllowRule>* allow, Logger* log);

bettercompute::agent::v1::TunnelFrame Closed(int exit_code, std::string reason = "");

}  // namespace bcd::tunnels
