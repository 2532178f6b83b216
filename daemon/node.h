#pragma once

// A running mode (node, site): the identity from the state dir, the gRPC transport and the session
// engine, wired together. main() adds signals; tests drive it directly.

#include <memory>

#include "absl/status/statusor.h"
#include "daemon/config.h"
#include "daemon/log.h"
#include "daemon/session.h"
#include "proto/kinds.h"
#include "transport/grpc_transport.h"

namespace bcd {

struct NodeDaemonEnv {
  std::function<int64_t()> now;
  std::function<double()> uniform01;
  Logger* log = nullptr;
  std::chrono::milliseconds status_interval = std::chrono::minutes(5);
};

class NodeDaemon {
 public:
  // FailedPrecondition when the node has not joined; Unauthenticated when its certificate expired
  // (the message says how to re-join); DataLoss naming a corrupt state file.
  static absl::StatusOr<std::unique_ptr<NodeDaemon>> Create(const Config& config, proto::Mode mode,
                                                            NodeDaemonEnv env);
  absl::Status Run() { return engine_->Run(); }
  void Stop() { engine_->Stop(); }
  SessionSnapshot Snapshot() const { return engine_->Snapshot(); }

 private:
  NodeDaemon() = default;
  std::unique_ptr<transport::GrpcTransport> transport_;
  std::unique_ptr<SessionEngine> engine_;
};

}  // namespace bcd
