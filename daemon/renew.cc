#include "daemon/renew.h"

#include <thread>

#include "bettercompute/agent/v1/session.grpc.pb.h"
#include "daemon/backoff.h"
#include "fmt/format.h"
#include "grpcpp/client_context.h"
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

RenewCall GrpcRenewCall(transport::ChannelSpec gateway) {
  return [gateway](const v1::RenewRequest& request, const Identity& current,
                   transport::Refusal* refusal) -> absl::StatusOr<v1::RenewResponse> {
    transport::ChannelSpec spec = gateway;
    std::string chain_pem;
    for (const pki::Certificate& cert : current.chain) chain_pem += cert.Pem();
    spec.identity = transport::ClientIdentity{current.key.ToPem(), chain_pem};
    auto stub = v1::AgentGateway::NewStub(transport::MakeChannel(spec));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::RenewResponse response;
    grpc::Status status = stub->Renew(&context, request, &response);
    if (!status.ok()) {
      transport::Refusal why = transport::RefusalOf(status, context);
      if (refusal != nullptr) *refusal = why;
      return absl::UnavailableError("renew " + why.ToString());
    }
    return response;
  };
}

RenewCall HttpsRenewCall(transport::WebSocketSpec spec) {
  return [spec](const v1::RenewRequest& request, const Identity&,
                transport::Refusal* refusal) -> absl::StatusOr<v1::RenewResponse> {
    absl::StatusOr<std::string> body = proto::EncodeMessage(request);
    if (!body.ok()) return body.status();
    absl::StatusOr<transport::HttpAnswer> answer =
        transport::HttpsPost(spec, "/v1/renew", "application/x-protobuf", *body, 256 * 1024);
    if (!answer.ok())
      return absl::UnavailableError("renew: " + std::string(ToStd(answer.status().message())));
    if (answer->status != 200) {
      std::string text = answer->body.substr(0, 200);
      for (char& c : text) {
        if (!std::isprint(static_cast<unsigned char>(c))) c = '?';
      }
      transport::Refusal why = transport::RefusalOfHttp(
          answer->status, answer->headers, fmt::format("HTTP {} {}", answer->status, text));
      if (refusal != nullptr) *refusal = why;
      return absl::UnavailableError("renew " + why.ToString());
    }
    v1::RenewResponse response;
    if (absl::Status s = proto::DecodeMessage(answer->body, &response); !s.ok()) {
      return absl::UnavailableError(
          fmt::format("renew: the answer is not a RenewResponse: {}", ToStd(s.message())));
    }
    return response;
  };
}

absl::StatusOr<Identity> RenewOnce(const RenewCall& call, const StateDir& state,
                                   const Identity& current,
                                   const std::vector<pki::Certificate>& node_cas,
                                   const std::function<int64_t()>& now,
                                   transport::Refusal* refusal) {
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

  absl::StatusOr<v1::RenewResponse> response = call(request, current, refusal);
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
                 std::function<int64_t()> now, std::function<double()> uniform01, Logger* log,
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
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Renewer::WaitForRenewals(int count, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return renewals_ >= count; });
}

int Renewer::renewals() const {
  std::lock_guard<std::mutex> lock(mu_);
  return renewals_;
}

void Renewer::Loop() {
  Backoff backoff(uniform01_);
  std::unique_lock<std::mutex> lock(mu_);
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
                 [&] { return stopping_; });
  }
}

}  // namespace bcd
