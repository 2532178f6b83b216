#include "daemon/identity/renew.h"

#include <thread>

#include "base/backoff.h"
#include "base/mutex.h"
#include "fmt/format.h"
#include "proto/absl_compat.h"
#include "proto/frame_codec.h"
#include "proto/signing_input.h"
#include "transport/refusal.h"

namespace bcd {

namespace v1 = bettercompute::agent::v1;

int64_t RenewalTime(int64_t not_before, int64_t not_after, double uniform01) {
  int64_t life = std::max<int64_t>(1, not_after - not_before);
  return not_before + life * 2 / 3 +
         static_cast<int64_t>(uniform01 * static_cast<double>(life) / 10);
}

RenewCall RenewThrough(transport::Transport* transport) {
  return [transport](const v1::RenewRequest& request, transport::Refusal* refusal) {
    return transport->Renew(request, refusal);
  };
}

absl::StatusOr<Identity> RenewOnce(const RenewCall& call, const StateDir& state,
                                   const Identity& current,
                                   const std::vector<pki::Certificate>& node_cas,
                                   const UnixClock& now, transport::Refusal* refusal) {
  absl::StatusOr<pki::PrivateKey> key = pki::PrivateKey::Generate();
  if (!key.ok()) return key.status();
  absl::StatusOr<std::string> csr = pki::CreateCsr(*key, current.node.id.node());
  if (!csr.ok()) return csr.status();
  v1::RenewRequest request;
  for (const pki::Certificate& cert : current.chain) request.add_chain(cert.Der());
  request.set_csr(*csr);
  request.set_timestamp(static_cast<uint64_t>(now()));
  request.set_nonce(pki::RandomBytes(16));
  absl::StatusOr<std::string> proof = current.key.SignEs256(proto::RenewSigningInput(request));
  if (!proof.ok()) return proof.status();
  request.set_proof(*proof);

  absl::StatusOr<v1::RenewResponse> response = call(request, refusal);
  if (!response.ok()) return response.status();

  absl::StatusOr<std::vector<pki::Certificate>> chain = pki::ParseDerChain(
      {response->certificate_chain().begin(), response->certificate_chain().end()});
  if (!chain.ok()) return chain.status();
  auto refuse = [](std::string why) {
    return absl::UnauthenticatedError("renewed certificate refused: " + why);
  };
  if (chain->front().SpkiDer() != key->Public().SpkiDer())
    return refuse("it is not for the new key");
  if (absl::Status s = pki::VerifyChain(*chain, node_cas, now()); !s.ok()) {
    return refuse(fmt::format("it does not chain to the node CA: {}", ToStd(s.message())));
  }
  absl::StatusOr<pki::NodeIdentity> node = pki::IdentityOf(chain->front());
  if (!node.ok()) return refuse(std::string(ToStd(node.status().message())));
  if (!(node->id == current.node.id)) {
    return refuse(fmt::format("it names {}, this node is {}", node->id.ToString(),
                              current.node.id.ToString()));
  }
  if (absl::Status s = state.SaveRenewed(*key, *chain); !s.ok()) return s;
  return Identity{*std::move(key), *std::move(chain), *std::move(node), current.join_service_key,
                  current.trust_bundle};
}

Renewer::Renewer(RenewCall call, StateDir state, std::vector<pki::Certificate> node_cas,
                 UnixClock now, std::function<double()> uniform01, Logger* log,
                 std::function<void(const Identity&)> on_renewed)
    : call_(std::move(call)),
      state_(std::move(state)),
      node_cas_(std::move(node_cas)),
      now_(std::move(now)),
      uniform01_(std::move(uniform01)),
      log_(log),
      on_renewed_(std::move(on_renewed)) {}

Renewer::~Renewer() { Stop(); }

void Renewer::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void Renewer::Stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Renewer::WaitForRenewals(int count, std::chrono::milliseconds timeout) const {
  UniqueLock lock(mu_);
  return cv_.wait_for(lock, timeout,
                      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return renewals_ >= count; });
}

int Renewer::renewals() const {
  MutexLock lock(mu_);
  return renewals_;
}

void Renewer::Loop() {
  Backoff backoff(uniform01_);
  UniqueLock lock(mu_);
  while (!stopping_) {
    lock.unlock();
    absl::StatusOr<Identity> current = state_.LoadIdentity();
    lock.lock();
    if (!current.ok()) {
      log_->Warn("renew.identity_unreadable",
                 {{"error", std::string(ToStd(current.status().message()))}});
      return;
    }
    const pki::Certificate& leaf = current->chain.front();
    int64_t at = RenewalTime(leaf.NotBefore(), leaf.NotAfter(), uniform01_());
    // One timed wait, no polling: the daemon wakes only for its timers and keepalives.
    while (!stopping_ && now_() < at) cv_.wait_for(lock, std::chrono::seconds(at - now_()));
    if (stopping_) return;
    lock.unlock();
    transport::Refusal refusal;
    absl::StatusOr<Identity> renewed =
        RenewOnce(call_, state_, *current, node_cas_, now_, &refusal);
    lock.lock();
    if (counter_ != nullptr) counter_->Add({renewed.ok() ? "ok" : StatusLabel(renewed.status())});
    if (renewed.ok()) {
      ++renewals_;
      cv_.notify_all();
      if (on_renewed_) {
        lock.unlock();
        on_renewed_(*renewed);
        lock.lock();
      }
      backoff.Reset();
      log_->Info("renew.done",
                 {{"not_after", std::to_string(renewed->chain.front().NotAfter())},
                  {"generation", std::to_string(renewed->node.generation.value_or(0))}});
      continue;
    }
    if (refusal.NeedsPerson()) {
      log_->Error("renew.stopped", {{"error", std::string(ToStd(renewed.status().message()))}});
      return;
    }
    auto delay = refusal.pushback ? backoff.After(*refusal.pushback) : backoff.Next();
    int64_t left_ms = (leaf.NotAfter() - now_()) * 1000;
    log_->Warn("renew.failed", {{"error", std::string(ToStd(renewed.status().message()))},
                                {"retry_ms", std::to_string(delay.count())}});
    if (left_ms <= 0) {
      log_->Warn("renew.expired", {{"not_after", std::to_string(leaf.NotAfter())}});
      return;
    }
    cv_.wait_for(lock, std::min(delay, std::chrono::milliseconds(left_ms)),
                 [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; });
  }
}

}  // namespace bcd
