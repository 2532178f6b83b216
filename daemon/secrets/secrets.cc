#include "daemon/secrets/secrets.h"

#include <openssl/rand.h>

#include "base/mutex.h"
#include "fmt/format.h"
#include "pki/jwe.h"
#include "proto/absl_compat.h"
#include "proto/signing_input.h"

namespace bcd {

namespace v1 = bettercompute::agent::v1;

namespace {

constexpr char kBrokerErrorUrl[] = "bettercompute.dev/broker-error";

// The broker's error as a status naming the ref, with the error code attached.
absl::Status Refusal(const std::string& what, const std::string& error) {
  std::string message = fmt::format("{}: refused by the broker: {}", what, error);
  absl::Status status = error == "not-found"      ? absl::NotFoundError(message)
                        : error == "unavailable"  ? absl::UnavailableError(message)
                        : error == "rate-limited" ? absl::ResourceExhaustedError(message)
                                                  : absl::PermissionDeniedError(message);
  status.SetPayload(kBrokerErrorUrl, absl::Cord(error));
  return status;
}

}  // namespace

struct SecretClient::Wait {
  uint64_t session;
  bool done = false;
  std::string jwe, error;
  bool lost = false;  // the session ended first
};

SecretBinding HostBinding(std::string_view section, std::string_view field) {
  return {.workflow_id = fmt::format("host:{}", section), .step_id = std::string(field)};
}

std::string BrokerErrorOf(const absl::Status& status) {
  auto error = status.GetPayload(kBrokerErrorUrl);
  return error ? std::string(*error) : std::string();
}

SecretClient::SecretClient(SecretClientOptions options, Logger* log)
    : options_(std::move(options)), log_(log) {
  if (options_.metrics == nullptr) {
    own_metrics_ = std::make_unique<Metrics>();
    options_.metrics = own_metrics_.get();
  }
  requests_ = &options_.metrics->Counter("bcd_secret_requests_total",
                                         "Secret and workload-token requests, by type and outcome",
                                         {"type", "outcome"});
}

std::string SecretClient::NewRequestId() {
  unsigned char random[8];
  RAND_bytes(random, sizeof random);
  MutexLock lock(mu_);
  std::string id = fmt::format("r{}-", next_id_++);
  for (unsigned char b : random) id += fmt::format("{:02x}", b);
  return id;
}

absl::StatusOr<std::pair<std::string, std::string>> SecretClient::Exchange(
    const std::string& request_id, const v1::AgentFrame& frame, const std::string& what) {
  auto wait = std::make_shared<Wait>();
  {
    MutexLock lock(mu_);
    if (session_ == 0) {
      return absl::UnavailableError(fmt::format("{}: no session to the gateway", what));
    }
    wait->session = session_;
    waits_[request_id] = wait;
  }
  auto forget = [&] {
    MutexLock lock(mu_);
    waits_.erase(request_id);
  };
  if (!options_.send(frame)) {
    forget();
    return absl::UnavailableError(fmt::format("{}: no session to the gateway", what));
  }
  UniqueLock lock(mu_);
  bool answered = cv_.wait_for(lock, options_.timeout, [&] { return wait->done || wait->lost; });
  waits_.erase(request_id);
  if (wait->lost) {
    return absl::UnavailableError(
        fmt::format("{}: the session ended before the answer came", what));
  }
  if (!answered) {
    return absl::DeadlineExceededError(
        fmt::format("{}: no answer within {} ms", what, options_.timeout.count()));
  }
  return std::make_pair(std::move(wait->jwe), std::move(wait->error));
}

absl::StatusOr<std::string> SecretClient::ResolveUncounted(const std::string& ref,
                                                           const SecretBinding& binding) {
  std::string what = fmt::format("secret {}", ref);
  absl::StatusOr<pki::PrivateKey> node_key = options_.node_key();
  if (!node_key.ok()) return node_key.status();
  absl::StatusOr<pki::PrivateKey> ephemeral = pki::PrivateKey::Generate();
  if (!ephemeral.ok()) return ephemeral.status();
  v1::AgentFrame frame;
  v1::SecretRequest* request = frame.mutable_secret_request();
  request->set_ref(ref);
  request->set_workflow_id(binding.workflow_id);
  request->set_step_id(binding.step_id);
  request->set_allocation_id(binding.allocation_id);
  request->set_epk(ephemeral->Public().Sec1());
  request->set_request_id(NewRequestId());
  absl::StatusOr<std::string> sig = node_key->SignEs256(proto::SecretRequestSigningInput(*request));
  if (!sig.ok()) return sig.status();
  request->set_node_sig(*sig);
  std::string request_id = request->request_id();
  log_->Info("secret.request", {{"ref", ref}, {"request_id", request_id}});
  absl::StatusOr<std::pair<std::string, std::string>> answer = Exchange(request_id, frame, what);
  if (!answer.ok()) {
    log_->Warn("secret.failed", {{"ref", ref},
                                 {"request_id", request_id},
                                 {"error", std::string(ToStd(answer.status().message()))}});
    return answer.status();
  }
  if (!answer->second.empty()) return Refusal(what, answer->second);
  std::string rid = request_id;
  absl::StatusOr<std::string> value = pki::OpenJwe(answer->first, *ephemeral,
                                                   {.typ = pki::kSecretJweType,
                                                    .bindings = {{"ref", ref}, {"rid", rid}},
                                                    .now = options_.now()});
  if (!value.ok()) {
    return absl::UnauthenticatedError(
        fmt::format("{}: the answer was refused: {}", what, ToStd(value.status().message())));
  }
  return value;
}

absl::StatusOr<std::string> SecretClient::Resolve(const std::string& ref,
                                                  const SecretBinding& binding) {
  absl::StatusOr<std::string> value = ResolveUncounted(ref, binding);
  requests_->Add({"secret", StatusLabel(value.status())});
  return value;
}

absl::StatusOr<std::string> SecretClient::WorkloadToken(const std::string& instance_id,
                                                        const std::string& audience) {
  absl::StatusOr<std::string> token = WorkloadTokenUncounted(instance_id, audience);
  requests_->Add({"workload_token", StatusLabel(token.status())});
  return token;
}

absl::StatusOr<std::vector<std::string>> SecretClient::ResolveAll(
    const std::vector<std::string>& refs, const SecretBinding& binding) {
  std::vector<std::string> values;
  for (const std::string& ref : refs) {
    absl::StatusOr<std::string> value = Resolve(ref, binding);
    if (!value.ok()) return value.status();
    values.push_back(*std::move(value));
  }
  return values;
}

absl::StatusOr<std::vector<std::string>> SecretClient::ResolveFor(
    const v1::Command& command, const std::vector<std::string>& refs) {
  return ResolveAll(refs, {command.workflow_id(), command.step_id(), command.allocation_id()});
}

absl::StatusOr<std::string> SecretClient::WorkloadTokenUncounted(const std::string& instance_id,
                                                                 const std::string& audience) {
  std::string what = fmt::format("workload token for {}", instance_id);
  absl::StatusOr<pki::PrivateKey> node_key = options_.node_key();
  if (!node_key.ok()) return node_key.status();
  absl::StatusOr<pki::PrivateKey> ephemeral = pki::PrivateKey::Generate();
  if (!ephemeral.ok()) return ephemeral.status();
  v1::AgentFrame frame;
  v1::WorkloadTokenRequest* request = frame.mutable_workload_token_request();
  request->set_request_id(NewRequestId());
  request->set_instance_id(instance_id);
  request->set_audience(audience);
  request->set_epk(ephemeral->Public().Sec1());
  absl::StatusOr<std::string> sig = node_key->SignEs256(proto::WorkloadTokenSigningInput(*request));
  if (!sig.ok()) return sig.status();
  request->set_node_sig(*sig);
  std::string request_id = request->request_id();
  log_->Info("workload_token.request", {{"instance_id", instance_id}, {"request_id", request_id}});
  absl::StatusOr<std::pair<std::string, std::string>> answer = Exchange(request_id, frame, what);
  if (!answer.ok()) return answer.status();
  if (!answer->second.empty()) return Refusal(what, answer->second);
  absl::StatusOr<std::string> token =
      pki::OpenJwe(answer->first, *ephemeral,
                   {.typ = pki::kWorkloadJweType,
                    .bindings = {{"iid", instance_id}, {"rid", request_id}},
                    .now = options_.now()});
  if (!token.ok()) {
    return absl::UnauthenticatedError(
        fmt::format("{}: the answer was refused: {}", what, ToStd(token.status().message())));
  }
  return token;
}

void SecretClient::SessionUp(uint64_t session) {
  MutexLock lock(mu_);
  session_ = session;
}

void SecretClient::SessionDown() {
  {
    MutexLock lock(mu_);
    session_ = 0;
    for (auto& [id, wait] : waits_) wait->lost = true;
  }
  cv_.notify_all();
}

void SecretClient::Deliver(const std::string& request_id, std::string jwe, std::string error) {
  {
    MutexLock lock(mu_);
    auto it = waits_.find(request_id);
    // An answer to nothing: never asked, asked on an earlier session, or already answered.
    if (it == waits_.end() || it->second->session != session_ || it->second->done) {
      ++unmatched_;
      log_->Warn("secret.unmatched_answer", {{"request_id", request_id}});
      return;
    }
    it->second->done = true;
    it->second->jwe = std::move(jwe);
    it->second->error = std::move(error);
  }
  cv_.notify_all();
}

void SecretClient::OnSecretResponse(const v1::SecretResponse& response) {
  Deliver(response.request_id(), response.jwe(), response.error());
}

void SecretClient::OnWorkloadTokenResponse(const v1::WorkloadTokenResponse& response) {
  Deliver(response.request_id(), response.jwe(), response.error());
}

int SecretClient::unmatched() const {
  MutexLock lock(mu_);
  return unmatched_;
}

}  // namespace bcd
