#pragma once

// The secret client: commands and specs carry secret references, never values, and bcd fetches
// each value over the session. Every request gets a fresh P-256 key (epk) used once, and the node
// key signs every other field (node_sig); the answer is a compact JWE to that key whose typ,
// binding (ref or instance id, request id) and exp must match the request. Answers are matched by
// request id on the session that asked; a wait ends after 10 s, at once when that session drops,
// and an answer to nothing is ignored and counted. Values are never logged: log lines name the ref
// and the request id only.
//
// Thread-safe: handlers call Resolve/WorkloadToken from lane threads; the session thread delivers
// answers and session changes.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/mutex.h"
#include "bettercompute/agent/v1/session.pb.h"
#include "pki/keys.h"

namespace bcd {

// What a secret is bound to: a command's workflow step or allocation, or, for a credential the
// node's own spec names, workflow "host:<unit or section>" and the field as step (HostBinding).
struct SecretBinding {
  std::string workflow_id;
  std::string step_id;
  std::string allocation_id;
};
SecretBinding HostBinding(std::string_view section, std::string_view field);

// The broker's refusal in a Resolve/WorkloadToken error ("not-found", "not-bound",
// "access-denied", "unavailable", ...; for workload tokens also "disabled", "audience",
// "rate-limited"), or "" when the error is bcd's own (timeout, session lost, a JWE refused).
std::string BrokerErrorOf(const absl::Status& status);

struct SecretClientOptions {
  // Sends a frame on the current session; false when there is none.
  std::function<bool(const bettercompute::agent::v1::AgentFrame&)> send;
  // The node key that signs requests (read at each request: a renewal may change it).
  std::function<absl::StatusOr<pki::PrivateKey>()> node_key;
  UnixClock now;
  std::chrono::milliseconds timeout = std::chrono::seconds(10);
  // Where requests are counted by type (secret, workload_token) and outcome; a registry of the
  // client's own when null. Outlives the client.
  Metrics* metrics = nullptr;
};

class SecretClient {
 public:
  SecretClient(SecretClientOptions options, Logger* log);

  // The value of `ref`. Errors name the ref: NotFound / PermissionDenied / Unavailable /
  // ResourceExhausted for the broker's refusals (BrokerErrorOf says which), DeadlineExceeded after
  // the timeout, Unavailable when there is no session or it dropped, Unauthenticated when the JWE
  // does not match the request.
  absl::StatusOr<std::string> Resolve(const std::string& ref, const SecretBinding& binding);
  // Every ref of one command or spec section, in order; the first failure ends the call.
  absl::StatusOr<std::vector<std::string>> ResolveAll(const std::vector<std::string>& refs,
                                                      const SecretBinding& binding);
  // The one call a handler makes: `refs` bound to its command's workflow, step and allocation.
  absl::StatusOr<std::vector<std::string>> ResolveFor(
      const bettercompute::agent::v1::Command& command, const std::vector<std::string>& refs);
  // A workload identity token (a JWT) for `instance_id`; audience empty for the default.
  absl::StatusOr<std::string> WorkloadToken(const std::string& instance_id,
                                            const std::string& audience);

  // From the session engine.
  void SessionUp(uint64_t session);  // a new session was welcomed
  void SessionDown();                // it ended: every wait fails now
  void OnSecretResponse(const bettercompute::agent::v1::SecretResponse& response);
  void OnWorkloadTokenResponse(const bettercompute::agent::v1::WorkloadTokenResponse& response);

  int unmatched() const;  // answers to nothing, ignored

 private:
  struct Wait;
  // Sends `frame` and waits for the answer to `request_id`; the answer's JWE and error.
  absl::StatusOr<std::pair<std::string, std::string>> Exchange(
      const std::string& request_id, const bettercompute::agent::v1::AgentFrame& frame,
      const std::string& what);
  std::string NewRequestId();
  absl::StatusOr<std::string> ResolveUncounted(const std::string& ref,
                                               const SecretBinding& binding);
  absl::StatusOr<std::string> WorkloadTokenUncounted(const std::string& instance_id,
                                                     const std::string& audience);
  void Deliver(const std::string& request_id, std::string jwe, std::string error);

  SecretClientOptions options_;
  std::unique_ptr<Metrics> own_metrics_;  // when the options gave none
  CounterFamily* requests_;               // by type and outcome
  Logger* log_;
  mutable Mutex mu_;
  CondVar cv_;
  uint64_t session_ ABSL_GUARDED_BY(mu_) = 0;  // 0 while none
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  int unmatched_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::shared_ptr<Wait>> waits_ ABSL_GUARDED_BY(mu_);  // by request id
};

}  // namespace bcd
