#pragma once

// Certificate renewal: at 2/3 of the certificate's life (plus up to 10 % jitter), a fresh key and
// CSR go to Renew over mutual TLS with a proof of possession of the current key; the new key and
// chain replace the old ones atomically, and only after they verify (same SPIFFE id, chains to the
// node CA the node trusts, for the new key). The session goes on; the next dial uses the new
// identity.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/mutex.h"
#include "daemon/identity/identity.h"
#include "pki/trust.h"
#include "transport/refusal.h"
#include "transport/transport.h"

namespace bcd {

// Carries one RenewRequest to the gateway: the transport's Renew (gRPC with mutual TLS, or POST
// /v1/renew on the WebSocket origin). When the gateway refused, the error's message names it and
// `refusal` (when given) holds its reason and pushback.
using RenewCall = std::function<absl::StatusOr<bettercompute::agent::v1::RenewResponse>(
    const bettercompute::agent::v1::RenewRequest& request, transport::Refusal* refusal)>;
// The transport's Renew; `transport` outlives the call.
RenewCall RenewThrough(transport::Transport* transport);

// One renewal, now. Returns the stored new identity. `now` is read when the request is signed and
// again when the answer is verified (a CA may stamp notBefore after the request left). The answer
// is believed only when the new chain is for the new key, leads to a node CA this node trusts and
// names this node, so a proxy in the middle cannot hand over a certificate of its own.
absl::StatusOr<Identity> RenewOnce(const RenewCall& call, const StateDir& state,
                                   const Identity& current,
                                   const std::vector<pki::Certificate>& node_cas,
                                   const UnixClock& now, transport::Refusal* refusal = nullptr);

// When to renew a certificate valid [not_before, not_after): 2/3 of its life plus jitter (0..10 %).
int64_t RenewalTime(int64_t not_before, int64_t not_after, double uniform01);

// Renews forever in its own thread until stopped; failures retry with backoff (the gateway's
// pushback wins), never past expiry; a refusal only a person can fix (revoked, ...) stops it.
class Renewer {
 public:
  Renewer(RenewCall call, StateDir state, std::vector<pki::Certificate> node_cas, UnixClock now,
          std::function<double()> uniform01, Logger* log,
          std::function<void(const Identity&)> on_renewed = nullptr);
  ~Renewer();
  // Counts renewal attempts by result ("ok", or the error's code) in `metrics` from now on. Call
  // before Start.
  void set_metrics(Metrics* metrics) {
    counter_ = &metrics->Counter("bcd_renewals_total", "Certificate renewal attempts, by result",
                                 {"result"});
  }
  void Start();
  void Stop();
  int renewals() const;
  // Waits until `count` renewals have succeeded; false on timeout.
  bool WaitForRenewals(int count, std::chrono::milliseconds timeout) const;

 private:
  void Loop();

  RenewCall call_;
  StateDir state_;
  std::vector<pki::Certificate> node_cas_;
  UnixClock now_;
  std::function<double()> uniform01_;
  Logger* log_;
  std::function<void(const Identity&)> on_renewed_;
  CounterFamily* counter_ = nullptr;
  std::thread thread_;
  mutable Mutex mu_;
  mutable CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int renewals_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace bcd
