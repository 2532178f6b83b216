#include "gtest/gtest.h"
#include "pki/envelope.h"
#include "proto/absl_compat.h"
#include "proto/signing_input.h"
#include "tests/unit/pki_fixtures.h"

namespace bcd::pki {
namespace {

using bcd::testing::Cert;
using bcd::testing::FromHex;
using bcd::testing::NodeFixtures;

std::string Message(const absl::Status& status) { return std::string(ToStd(status.message())); }

// Builds the signing input with bcd's own functions from the parts Node used.
std::string OurInput(const std::string& purpose, const std::vector<std::string>& p) {
  using proto::Purpose;
  if (purpose == "command") return proto::BodySigningInput(Purpose::kCommand, p[0]);
  if (purpose == "release") return proto::ReleaseSigningInput(p[0], p[1], p[2]);
  if (purpose == "renew") {
    bettercompute::agent::v1::RenewRequest request;
    request.set_csr(p[0]);
    uint64_t timestamp = 0;
    for (unsigned char c : p[1]) timestamp = timestamp << 8 | c;
    request.set_timestamp(timestamp);
    request.set_nonce(p[2]);
    request.add_chain(p[3]);
    return proto::RenewSigningInput(request);
  }
  if (purpose == "approver-set") {
    uint64_t epoch = 0;
    for (unsigned char c : p[0]) epoch = epoch << 8 | c;
    return proto::ApproverSetSigningInput(epoch, p[1], p[2]);
  }
  if (purpose == "secret-request") {
    bettercompute::agent::v1::SecretRequest request;
    request.set_ref(p[0]);
    request.set_workflow_id(p[1]);
    request.set_step_id(p[2]);
    request.set_allocation_id(p[3]);
    request.set_epk(p[4]);
    request.set_request_id(p[5]);
    return proto::SecretRequestSigningInput(request);
  }
  ADD_FAILURE() << "no case for " << purpose;
  return "";
}

TEST(NodeFixtures, SigningInputsMatchNodesLayoutAndNodeSignaturesVerify) {
  PublicKey key = *PublicKey::FromSpkiDer(FromHex(NodeFixtures()["signer_spki"]));
  for (const auto& c : NodeFixtures()["signatures"]) {
    SCOPED_TRACE(c["purpose"].get<std::string>());
    std::vector<std::string> parts;
    for (const auto& part : c["parts"]) parts.push_back(FromHex(part));
    std::string input = OurInput(c["purpose"], parts);
    EXPECT_EQ(Hex(input), c["input"].get<std::string>());
    bettercompute::common::v1::Signature sig;
    sig.set_sig(FromHex(c["sig"]));
    EXPECT_TRUE(VerifyWithKey(input, sig, key).ok());
    sig.set_sig(FromHex(c["high_s_sig"]));
    EXPECT_EQ(Message(VerifyWithKey(input, sig, key)),
              "the signature is not in low-S form (s > n/2)");
  }
}

TEST(NodeFixtures, ASignatureForOnePurposeFailsForAnother) {
  PublicKey key = *PublicKey::FromSpkiDer(FromHex(NodeFixtures()["signer_spki"]));
  const auto& c = NodeFixtures()["signatures"][0];  // purpose "command"
  bettercompute::common::v1::Signature sig;
  sig.set_sig(FromHex(c["sig"]));
  std::string spec_input = proto::BodySigningInput(proto::Purpose::kSpec, FromHex(c["parts"][0]));
  EXPECT_EQ(Message(VerifyWithKey(spec_input, sig, key)), "the signature does not verify");
}

TEST(Envelope, SignAndVerifyWithAPinnedKey) {
  PrivateKey key = *PrivateKey::Generate();
  std::string input = proto::BodySigningInput(proto::Purpose::kTrustBundle, "body");
  auto sig = *Sign(input, key, "join");
  EXPECT_EQ(sig.kid(), "join");
  EXPECT_TRUE(VerifyWithKey(input, sig, key.Public()).ok());
  EXPECT_FALSE(VerifyWithKey(input, sig, PrivateKey::Generate()->Public()).ok());
}

class WorkerChain : public ::testing::Test {
 protected:
  PrivateKey worker_ = *PrivateKey::FromPem(Cert("worker.key"));
  Certificate worker_cert_ = *Certificate::FromPem(Cert("worker.pem"));
  Certificate root_ = *Certificate::FromPem(Cert("signing-root.pem"));
  int64_t now_ = worker_cert_.NotBefore() + 3600;
  std::string input_ = proto::BodySigningInput(proto::Purpose::kCommand, "a command");
};

TEST_F(WorkerChain, AWorkerSignatureVerifiesThroughItsChain) {
  auto sig = *Sign(input_, worker_, "worker-1", {worker_cert_.Der()});
  EXPECT_TRUE(VerifyWithChain(input_, sig, {root_}, now_).ok());
}

TEST_F(WorkerChain, RefusesAChainToAnotherRoot) {
  auto sig = *Sign(input_, worker_, "worker-1", {worker_cert_.Der()});
  Certificate other = *Certificate::FromPem(Cert("root.pem"));
  EXPECT_EQ(Message(VerifyWithChain(input_, sig, {other}, now_)),
            "CN = worker-1: unable to get local issuer certificate");
}

TEST_F(WorkerChain, RefusesASignatureWithoutAChain) {
  auto sig = *Sign(input_, worker_, "worker-1");
  EXPECT_EQ(Message(VerifyWithChain(input_, sig, {root_}, now_)),
            "the signature carries no certificate chain");
}

TEST_F(WorkerChain, RefusesAChainWhoseLeafDidNotSign) {
  auto sig = *Sign(input_, *PrivateKey::Generate(), "worker-1", {worker_cert_.Der()});
  EXPECT_EQ(Message(VerifyWithChain(input_, sig, {root_}, now_)), "the signature does not verify");
}

TEST_F(WorkerChain, RefusesAnExpiredWorker) {
  auto sig = *Sign(input_, worker_, "worker-1", {worker_cert_.Der()});
  EXPECT_EQ(Message(VerifyWithChain(input_, sig, {root_}, worker_cert_.NotAfter() + 1)),
            "CN = worker-1: certificate has expired");
}

TEST_F(WorkerChain, ARememberedChainDecidesAsAFullVerificationWould) {
  ChainVerifier verifier;
  auto VerifyWithChain = [&](std::string_view input, const auto& signature,
                             const std::vector<Certificate>& anchors, int64_t now) {
    return verifier.Verify(input, signature, anchors, now);
  };
  auto sig = *Sign(input_, worker_, "worker-1", {worker_cert_.Der()});
  ASSERT_TRUE(VerifyWithChain(input_, sig, {root_}, now_).ok());  // remembered from here on
  EXPECT_TRUE(VerifyWithChain(input_, sig, {root_}, now_ + 1).ok());
  EXPECT_EQ(Message(VerifyWithChain(input_, sig, {root_}, worker_cert_.NotAfter() + 1)),
            "CN = worker-1: certificate has expired");
  EXPECT_EQ(Message(VerifyWithChain(input_, sig, {root_}, worker_cert_.NotBefore() - 1)),
            "CN = worker-1: certificate is not yet valid");
  Certificate other = *Certificate::FromPem(Cert("root.pem"));
  EXPECT_EQ(Message(VerifyWithChain(input_, sig, {other}, now_)),
            "CN = worker-1: unable to get local issuer certificate");
  std::string another = proto::BodySigningInput(proto::Purpose::kCommand, "another command");
  EXPECT_EQ(Message(VerifyWithChain(another, sig, {root_}, now_)), "the signature does not verify");
  auto forged = *Sign(input_, *PrivateKey::Generate(), "worker-1", {worker_cert_.Der()});
  EXPECT_EQ(Message(VerifyWithChain(input_, forged, {root_}, now_)),
            "the signature does not verify");
}

}  // namespace
}  // namespace bcd::pki
