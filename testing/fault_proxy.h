#pragma once

// A TCP relay on loopback between bcd and the dev gateway, for network faults: Stall() stops moving
// bytes in both directions while keeping every connection open (packets lost, no RST, as a dead
// network path looks), Resume() moves them again, Reset() closes every connection with a RST.

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace bcd::testing {

class FaultProxy {
 public:
  static absl::StatusOr<std::unique_ptr<FaultProxy>> Start(int upstream_port);
  ~FaultProxy();

  int port() const { return port_; }
  void Stall() { stalled_ = true; }
  void Resume() { stalled_ = false; }
  void Reset();
  int connections() const { return connections_; }

 private:
  FaultProxy() = default;
  void AcceptLoop();
  void Pump(int client, int upstream);

  int upstream_port_ = 0;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stalled_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<int> connections_{0};
  std::mutex mu_;
  std::vector<int> open_fds_;         // guarded by mu_
  std::vector<std::thread> threads_;  // guarded by mu_
  std::thread acceptor_;
};

}  // namespace bcd::testing
