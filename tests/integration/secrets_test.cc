// Secrets and workload tokens over a real session: the dev gateway's broker verifies node_sig
// with the session's client certificate and answers with a JWE to the request's one-use key.
// Every value here contains "S3CR3T"; no test may find it in what bcd logged.

#include "daemon/secrets/secrets.h"

#include <sstream>
#include <thread>

#include "daemon/agent.h"
#include "daemon/dispatch/desired.h"
#include "daemon/identity/join.h"
#include "gtest/gtest.h"
#include "modes/node/node_mode.h"
#include "proto/absl_compat.h"
#include "testing/child_process.h"
#include "testing/dev_gateway.h"
#include "testing/wait.h"
#include "tests/integration/joined_node.h"
#include "tests/unit/fake_root.h"

namespace bcd {
namespace {

using bcd::testing::DevGateway;
using bcd::testing::DevPki;
using bcd::testing::FakeRoot;
using bcd::testing::JoinedNode;
namespace v1 = bettercompute::agent::v1;
using std::chrono::seconds;

constexpr auto kWait = seconds(20);

std::string Message(const absl::Status& status) { return std::string(ToStd(status.message())); }

class Secrets : public ::testing::Test {
 protected:
  Secrets() {
    auto mode = std::make_unique<NodeMode>();
    node_mode_ = mode.get();
    node_.Start(std::move(mode));
    EXPECT_TRUE(gateway_->WaitForReceived("n-1", 1, kWait));
    gateway_->AddSecret("secret://db/password", "S3CR3T-db", {"wf-1", "step-1", ""});
    gateway_->AddSecret("vault://alloc/key", "S3CR3T-alloc", {"", "", "alloc-9"});
    gateway_->AddSecret("secret://k8s/token", "S3CR3T-k8s", {"host:k8s-join", "token_ref", ""});
  }
  ~Secrets() override {
    node_.Stop();
    EXPECT_EQ(log_text_.str().find("S3CR3T"), std::string::npos)
        << "a secret value reached the log:\n"
        << log_text_.str();
  }

  SecretClient& client() { return daemon_->secrets(); }

  JoinedNode node_{{.extra_config = [](const std::filesystem::path&) {
    return "[imds]\nlisten = \"127.0.0.1:" + std::to_string(bcd::testing::FreeLoopbackPort()) +
           "\"\n";
  }}};
  FakeRoot& dir_ = node_.dir;
  DevPki& pki_ = node_.pki;
  std::unique_ptr<DevGateway>& gateway_ = node_.gateway;
  std::ostringstream& log_text_ = node_.log_text;
  Logger& log_ = node_.log;
  std::unique_ptr<Agent>& daemon_ = node_.agent;
  NodeMode* node_mode_ = nullptr;  // the daemon's
};

TEST_F(Secrets, ValuesComeForTheirBindings) {
  EXPECT_EQ(*client().Resolve("secret://db/password", {"wf-1", "step-1", ""}), "S3CR3T-db");
  EXPECT_EQ(*client().Resolve("vault://alloc/key", {"wf-7", "step-3", "alloc-9"}), "S3CR3T-alloc");
  EXPECT_EQ(*client().Resolve("secret://k8s/token", HostBinding("k8s-join", "token_ref")),
            "S3CR3T-k8s");
  absl::StatusOr<std::vector<std::string>> both =
      client().ResolveAll({"secret://db/password", "secret://db/password"}, {"wf-1", "step-1", ""});
  EXPECT_EQ(*both, (std::vector<std::string>{"S3CR3T-db", "S3CR3T-db"}));
  v1::Command command;  // a handler's one call, bound to its command
  command.set_workflow_id("wf-7");
  command.set_step_id("step-3");
  command.set_allocation_id("alloc-9");
  EXPECT_EQ(*client().ResolveFor(command, {"vault://alloc/key"}),
            std::vector<std::string>{"S3CR3T-alloc"});
  EXPECT_EQ(gateway_->bad_node_sigs(), 0) << "the broker verified every node_sig";
  // The requests carried a fresh key each time.
  std::set<std::string> epks;
  for (const auto& frame : gateway_->Received("n-1"))
    if (frame.has_secret_request()) epks.insert(frame.secret_request().epk());
  EXPECT_EQ(epks.size(), 6u);
}

TEST_F(Secrets, EachRefusalIsTypedAndNamesTheRef) {
  absl::StatusOr<std::string> missing = client().Resolve("secret://nope", {"wf-1", "step-1", ""});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(BrokerErrorOf(missing.status()), "not-found");
  EXPECT_EQ(Message(missing.status()), "secret secret://nope: refused by the broker: not-found");

  absl::StatusOr<std::string> unbound =
      client().Resolve("secret://db/password", {"wf-1", "step-2", ""});
  EXPECT_EQ(BrokerErrorOf(unbound.status()), "not-bound");
  EXPECT_EQ(unbound.status().code(), absl::StatusCode::kPermissionDenied);

  gateway_->RefuseSecrets("unavailable");
  absl::StatusOr<std::string> down =
      client().Resolve("secret://db/password", {"wf-1", "step-1", ""});
  EXPECT_EQ(down.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(BrokerErrorOf(down.status()), "unavailable");
  gateway_->RefuseSecrets("");

  gateway_->SetTenantControlled("n-1", true);
  absl::StatusOr<std::string> tenant =
      client().Resolve("secret://db/password", {"wf-1", "step-1", ""});
  EXPECT_EQ(BrokerErrorOf(tenant.status()), "access-denied");
}

TEST_F(Secrets, TheBrokerChecksNodeSig) {
  ASSERT_TRUE(client().Resolve("secret://db/password", {"wf-1", "step-1", ""}).ok());
  EXPECT_EQ(gateway_->bad_node_sigs(), 0);
  // Checked against another key, bcd's signature no longer verifies: refused.
  gateway_->VerifyNodeSigsWith(pki::PrivateKey::Generate()->Public());
  absl::StatusOr<std::string> value =
      client().Resolve("secret://db/password", {"wf-1", "step-1", ""});
  EXPECT_EQ(BrokerErrorOf(value.status()), "access-denied");
  EXPECT_EQ(gateway_->bad_node_sigs(), 1);
}

TEST_F(Secrets, AnAnswerThatDoesNotMatchTheRequestIsRefused) {
  using Fault = DevGateway::SecretFault;
  for (auto [fault, why] : std::vector<std::pair<Fault, std::string>>{
           {Fault::kWrongRef, "ref \"secret://db/password-other\" does not match the request's"},
           {Fault::kWrongRid, "-other\" does not match the request's"},
           {Fault::kWrongTyp, "typ \"JWT\" is not bcsecret+jwe"},
           {Fault::kExpired, "expired"}}) {
    gateway_->SetSecretFault(fault);
    absl::StatusOr<std::string> value =
        client().Resolve("secret://db/password", {"wf-1", "step-1", ""});
    EXPECT_EQ(value.status().code(), absl::StatusCode::kUnauthenticated) << why;
    EXPECT_NE(Message(value.status()).find("secret secret://db/password: the answer was refused"),
              std::string::npos)
        << Message(value.status());
    EXPECT_NE(Message(value.status()).find(why), std::string::npos) << Message(value.status());
  }
}

TEST_F(Secrets, TenSecondsAtMostAndALateAnswerIsIgnored) {
  gateway_->DelaySecretAnswers(std::chrono::milliseconds(10500));
  absl::StatusOr<std::string> value =
      client().Resolve("secret://db/password", {"wf-1", "step-1", ""});
  EXPECT_EQ(value.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(Message(value.status()), "secret secret://db/password: no answer within 10000 ms");
  bcd::testing::WaitFor([&] { return client().unmatched() >= 1; }, kWait);
  EXPECT_EQ(client().unmatched(), 1) << "the late answer was counted and ignored";
  ASSERT_TRUE(gateway_->PushStraySecretAnswer("n-1"));
  bcd::testing::WaitFor([&] { return client().unmatched() >= 2; }, kWait);
  EXPECT_EQ(client().unmatched(), 2) << "an answer to nothing too";
}

TEST_F(Secrets, ASessionDropFailsTheWaitAtOnce) {
  gateway_->DelaySecretAnswers(std::chrono::seconds(8));
  std::thread dropper([&] {
    // Once the request is out, the session goes.
    bcd::testing::WaitFor(
        [&] {
          bool asked = false;
          for (const auto& frame : gateway_->Received("n-1")) asked |= frame.has_secret_request();
          return asked;
        },
        kWait);
    gateway_->DropSessions();
  });
  absl::StatusOr<std::string> value =
      client().Resolve("secret://db/password", {"wf-1", "step-1", ""});
  dropper.join();
  EXPECT_EQ(value.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Message(value.status()),
            "secret secret://db/password: the session ended before the answer came");
}

TEST_F(Secrets, WorkloadTokensForInstancesTheIssuerKnows) {
  gateway_->AllowWorkloadTokens("vm-1");
  absl::StatusOr<std::string> token = client().WorkloadToken("vm-1", "sts.example");
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(std::count(token->begin(), token->end(), '.'), 2) << "a compact JWT";
  absl::StatusOr<std::string> other = client().WorkloadToken("vm-2", "");
  EXPECT_EQ(BrokerErrorOf(other.status()), "not-bound");
  EXPECT_EQ(Message(other.status()), "workload token for vm-2: refused by the broker: not-bound");
  gateway_->SetSecretFault(DevGateway::SecretFault::kWrongRef);  // iid no longer matches
  EXPECT_EQ(client().WorkloadToken("vm-1", "").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(gateway_->bad_node_sigs(), 0);
}

// One HTTP request from `source` to the metadata service; the status line's code and the body.
std::pair<int, std::string> AskImds(const std::string& source, uint16_t port,
                                    const std::string& request) {
  std::string answer = bcd::testing::SendFrom(source, port, request);
  std::size_t body = answer.find("\r\n\r\n");
  if (answer.size() < 12 || body == std::string::npos) return {0, answer};
  return {std::stoi(answer.substr(9, 3)), answer.substr(body + 4)};
}

TEST_F(Secrets, TheMetadataServiceAnswersTheInstancesOfTheSpec) {
  gateway_->AddSecret("secret://vm-a/cloud-init", "S3CR3T-cloud-init", {"", "", "alloc-a"});
  gateway_->AllowWorkloadTokens("vm-a");
  v1::NodeSpec spec;
  spec.set_generation(1);
  spec.set_node_id("n-1");
  v1::VpsInstance* vm = spec.mutable_vps()->add_instances();
  vm->set_instance_id("vm-a");
  vm->set_allocation_id("alloc-a");
  vm->set_address("127.0.0.2");
  vm->set_user_data_ref("secret://vm-a/cloud-init");
  v1::ServerFrame frame;
  *frame.mutable_desired_state() = pki_.SignSpec(spec);
  ASSERT_TRUE(gateway_->Push("n-1", frame));
  bcd::testing::WaitFor([&] { return daemon_->desired().applied_generation() == 1; }, kWait);
  uint16_t port = node_mode_->imds_port();
  ASSERT_NE(port, 0);
  auto [status, token] =
      AskImds("127.0.0.2", port,
              "PUT /v1/api/token HTTP/1.1\r\nX-BC-Metadata-Token-TTL-Seconds: 60\r\n\r\n");
  ASSERT_EQ(status, 200) << token;
  std::string auth = "X-BC-Metadata-Token: " + token + "\r\n\r\n";
  auto [data_status, data] = AskImds("127.0.0.2", port, "GET /v1/user-data HTTP/1.1\r\n" + auth);
  EXPECT_EQ(data_status, 200);
  EXPECT_EQ(data, "S3CR3T-cloud-init");
  auto [jwt_status, jwt] =
      AskImds("127.0.0.2", port, "GET /v1/token?audience=sts HTTP/1.1\r\n" + auth);
  EXPECT_EQ(jwt_status, 200) << jwt;
  EXPECT_EQ(std::count(jwt.begin(), jwt.end(), '.'), 2);
  EXPECT_EQ(AskImds("127.0.0.3", port, "GET /v1/meta-data HTTP/1.1\r\n" + auth).first, 404)
      << "no instance holds 127.0.0.3";
}

}  // namespace
}  // namespace bcd
