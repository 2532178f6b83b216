#pragma once

// What a control plane does with a node, for the dev stack: turn a kind and a JSON payload into a
// signed command (approved by the dev approvers when the kind needs a quorum), push it, and wait
// for its terminal update; sign and push desired state; answer over a unix socket so that
// `bcd-dev run` and `bcd-dev spec` work against a running `bcd-dev up`.
//
// Thread-safe.

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "pki/keys.h"
#include "testing/dev_gateway.h"
#include "testing/dev_pki.h"

namespace bcd::testing {

class DevControlPlane {
 public:
  DevControlPlane(const DevPki* pki, DevGateway* gateway);
  ~DevControlPlane();

  // The trust bundle (version 2) with the dev approver set: 2 of 3 approvals, 10 unbatched
  // destructive commands an hour.
  bettercompute::agent::v1::SignedTrustBundle ApproverBundle() const;

  // Runs `kind` with `payload_json` (the payload message in protobuf JSON) on `node`. The answer
  // is JSON: {"command_id", "state", "code", "message", "updates": [...], "result": {...}}.
  // InvalidArgument for an unknown kind or a payload that does not parse; DeadlineExceeded when
  // no terminal update came within `timeout`.
  absl::StatusOr<std::string> Run(const std::string& node, const std::string& kind,
                                  const std::string& payload_json,
                                  std::chrono::milliseconds timeout);
  // Signs `spec_json` (a NodeSpec; node_id and generation default to the node and the next
  // generation; an absent access section becomes the dev tunnel keys) and pushes it; answers with
  // the SpecAck as JSON.
  absl::StatusOr<std::string> ApplySpec(const std::string& node, const std::string& spec_json,
                                        std::chrono::milliseconds timeout);

  // Serves requests on a unix socket (0600) until destroyed. A request is one JSON object:
  // {"op": "run", "kind": K, "payload": {...}}, {"op": "spec", "spec": {...}} or
  // {"op": "secret", "ref": R, "value": V, "workflow_id"/"step_id"/"allocation_id": ...} (puts a
  // secret in the dev broker) or {"op": "token", "node": ID} (a one-time join token for ID); the
  // answer is {"ok": true, "answer": {...}} or
  // {"ok": false, "error": "..."}.
  absl::Status Serve(const std::filesystem::path& socket, const std::string& node);
  // A connection whose first message is a tunnel request ('o', below) becomes an operator's
  // tunnel instead, served on its own thread until either side closes.

 private:
  void Loop(std::string node);
  void ServeTunnel(int fd, const std::string& node);
  std::mutex tunnels_mu_;
  std::vector<std::thread> tunnel_threads_;  // guarded by tunnels_mu_
  std::string Handle(const std::string& request, const std::string& node);

  const DevPki* pki_;
  DevGateway* gateway_;
  std::vector<pki::PrivateKey> approvers_;
  std::mutex mu_;
  uint64_t next_command_ = 1;     // guarded by mu_
  uint64_t next_generation_ = 1;  // guarded by mu_
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// A message as protobuf JSON with the .proto field names.
std::string ProtoJson(const google::protobuf::Message& message);

// Sends one request to the socket of a running `bcd-dev up` and returns its answer.
absl::StatusOr<std::string> AskDevControl(const std::filesystem::path& socket,
                                          const std::string& request);

// Tunnels through dev.sock (bcd-dev exec, shell, forward). Messages both ways: a type byte, a
// 4-byte big-endian length, the payload (at most 1 MiB).
//   to the stack:   'o' the request as JSON {"op", "cmd", "host", "port", "rows", "cols"} (first),
//                   'd' bytes for channel 0, 'e' end of input, 'r' "ROWS COLS", 'x' close
//   from the stack: 'O' opened, 'F' why it did not open, 'D' channel 0, 'E' channel 1 (stderr),
//                   'C' {"exit_code", "reason"} (last)
absl::StatusOr<int> ConnectDevControl(const std::filesystem::path& socket_path);
bool WriteTunnelMessage(int fd, char type, std::string_view payload);
bool ReadTunnelMessage(int fd, char* type, std::string* payload);

}  // namespace bcd::testing
