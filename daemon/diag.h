#pragma once

// The diagnostics listener ([diag] listen; off unless configured, loopback unless allow_remote):
//
//   GET /metrics  the metrics registry in the Prometheus text format
//   GET /healthz  200 "ok" while the engine's threads answer (the liveness check the systemd
//                 watchdog uses too), else 503 saying what has not answered
//   GET /readyz   200 "ready" while a session is welcomed, else 503 saying why not
//
// HEAD works on each. Bounded like the metadata service: at most kMaxConnections requests in hand
// (more are closed at once), kMaxHeaderBytes of request headers, no body, and request_deadline for
// a request to arrive whole and as long for its answer to leave. One request per connection.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/statusor.h"
#include "base/log.h"
#include "base/mutex.h"
#include "config/values.h"

namespace bcd {

struct DiagOptions {
  ListenAddress listen;                  // port 0: any free port (tests)
  std::function<std::string()> metrics;  // the registry as text
  std::function<absl::Status()> healthy;
  std::function<absl::Status()> ready;
  std::chrono::milliseconds request_deadline = std::chrono::seconds(5);
};

class DiagServer {
 public:
  static constexpr int kMaxConnections = 8;
  static constexpr std::size_t kMaxHeaderBytes = 8 * 1024;

  static absl::StatusOr<std::unique_ptr<DiagServer>> Start(DiagOptions options, Logger* log);
  ~DiagServer();
  uint16_t port() const { return port_; }
  // The answer, as sent, to one request given as its bytes ("" while they are not yet a whole
  // request). The fuzz target drives the request handling through it.
  std::string AnswerBytes(std::string_view bytes) const;

 private:
  explicit DiagServer(DiagOptions options) : options_(std::move(options)) {}
  void Loop();
  void Serve(int fd) const;

  DiagOptions options_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: stop
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  Mutex mu_;
  CondVar idle_;                             // a request ended
  std::set<int> open_ ABSL_GUARDED_BY(mu_);  // the sockets of requests being served
  std::thread thread_;
};

}  // namespace bcd
