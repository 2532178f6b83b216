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
#include "daemon/identity.h"
#include "daemon/log.h"
#include "pki/trust.h"
#include "transport/tls.h"

namespace bcd {

// One renewal, now. Returns the stored new identity. `now` is read when the request is signed and
// again when the answer is verified (a CA may stamp notBefore after the request left).
absl::StatusOr<Identity> RenewOnce(const transport::ChannelSpec& gateway, const StateDir& state,
                                   const Identity& current,
                                   const std::vector<pki::Certificate>& node_cas,
                                   const std::function<int64_t()>& now);

// When to renew a certificate valid [not_before, not_after): 2/3 of its life plus jitter (0..10 %).
int64_t RenewalTime(int64_t not_before, int64_t not_after, double uniform01);

// Renews forever in its own thread until stopped; failures retry with backoff, never past expiry.
class Renewer {
 public:
  Renewer(transport::ChannelSpec gateway, StateDir state, std::vector<pki::Certificate> node_cas,
          std::function<int64_t()> now, std::function<double()> uniform01, Logger* log,
          std::function<void(const Identity&)> on_renewed = nullptr);
  ~Renewer();
  void Start();
  void Stop();
  int renewals() const;
  // Waits until `count` renewals have succeeded; false on timeout.
  bool WaitForRenewals(int count, std::chrono::milliseconds timeout) const;

 private:
  void Loop();

  transport::ChannelSpec gateway_;
  StateDir state_;
  std::vector<pki::Certificate> node_cas_;
  std::function<int64_t()> now_;
  std::function<double()> uniform01_;
  Logger* log_;
  std::function<void(const Identity&)> on_renewed_;
  std::thread thread_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool stopping_ = false;  // guarded by mu_
  int renewals_ = 0;       // guarded by mu_
};

}  // namespace bcd
