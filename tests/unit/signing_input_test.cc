#include "proto/signing_input.h"

#include "gtest/gtest.h"

namespace bcd::proto {
namespace {

namespace v1 = bettercompute::agent::v1;
using namespace std::string_literals;

TEST(SigningInput, LaysOutPrefixPurposeZeroAndLengthPrefixedParts) {
  EXPECT_EQ(SigningInput(Purpose::kCommand, {"abc"}),
            "bettercompute.v1/command\0"s + "\0\0\0\x03"s + "abc");
  EXPECT_EQ(SigningInput(Purpose::kSpec, {"", "xy"}),
            "bettercompute.v1/spec\0"s + "\0\0\0\0"s + "\0\0\0\x02xy"s);
  EXPECT_EQ(SigningInput(Purpose::kDiscovery, {}), "bettercompute.v1/discovery\0"s);
}

TEST(SigningInput, LengthsAreBigEndianUint32) {
  std::string part(0x010203, 'p');
  std::string input = SigningInput(Purpose::kCommand, {part});
  EXPECT_EQ(input.substr(25, 4), "\x00\x01\x02\x03"s);
  EXPECT_EQ(input.size(), 25 + 4 + part.size());
}

TEST(SigningInput, PurposeNamesAreTheProtocolTokens) {
  const std::pair<Purpose, std::string_view> expected[] = {
      {Purpose::kJoinResponse, "join-response"},
      {Purpose::kTrustBundle, "trust-bundle"},
      {Purpose::kApproverSet, "approver-set"},
      {Purpose::kCommand, "command"},
      {Purpose::kApprove, "approve"},
      {Purpose::kSpec, "spec"},
      {Purpose::kSecretRequest, "secret-request"},
      {Purpose::kWorkloadToken, "workload-token"},
      {Purpose::kRenew, "renew"},
      {Purpose::kWsSession, "ws-session"},
      {Purpose::kGatewayProof, "gateway-proof"},
      {Purpose::kDiscovery, "discovery"},
      {Purpose::kRelease, "release"},
  };
  for (auto [purpose, name] : expected) EXPECT_EQ(PurposeName(purpose), name);
}

TEST(SigningInput, BigEndianIntegers) {
  EXPECT_EQ(Uint32Be(0x01020304), "\x01\x02\x03\x04"s);
  EXPECT_EQ(Uint64Be(0x0102030405060708ull), "\x01\x02\x03\x04\x05\x06\x07\x08"s);
  EXPECT_EQ(Uint64Be(0), std::string(8, '\0'));
}

TEST(SigningInput, DifferentPurposesNeverShareAnInput) {
  EXPECT_NE(BodySigningInput(Purpose::kCommand, "b"), BodySigningInput(Purpose::kSpec, "b"));
}

TEST(SigningInput, SecretRequestCoversEveryFieldButTheSignatureInOrder) {
  v1::SecretRequest request;
  request.set_ref("secret://a");
  request.set_workflow_id("wf");
  request.set_step_id("st");
  request.set_allocation_id("al");
  request.set_epk("K");
  request.set_request_id("r1");
  request.set_node_sig("ignored");
  EXPECT_EQ(SecretRequestSigningInput(request), "bettercompute.v1/secret-request\0"s +
                                                    "\0\0\0\x0asecret://a"s + "\0\0\0\x02wf"s +
                                                    "\0\0\0\x02st"s +
                                                    "\0\0\0\x02"
                                                    "al"s +
                                                    "\0\0\0\x01K"s + "\0\0\0\x02r1"s);
}

TEST(SigningInput, WorkloadTokenCoversEveryFieldButTheSignatureInOrder) {
  v1::WorkloadTokenRequest request;
  request.set_request_id("r");
  request.set_instance_id("i");
  request.set_audience("");
  request.set_epk("K");
  request.set_node_sig("ignored");
  EXPECT_EQ(WorkloadTokenSigningInput(request), "bettercompute.v1/workload-token\0"s +
                                                    "\0\0\0\x01r"s + "\0\0\0\x01i"s + "\0\0\0\0"s +
                                                    "\0\0\0\x01K"s);
}

TEST(SigningInput, RenewSignsCsrTimestampNonceAndTheCurrentLeaf) {
  v1::RenewRequest request;
  request.set_csr("C");
  request.set_timestamp(0x0102);
  request.set_nonce("N");
  request.add_chain("LEAF");
  request.add_chain("INTERMEDIATE");
  request.set_proof("ignored");
  EXPECT_EQ(RenewSigningInput(request), "bettercompute.v1/renew\0"s +
                                            "\0\0\0\x01"
                                            "C"s +
                                            "\0\0\0\x08"s + "\0\0\0\0\0\0\x01\x02"s +
                                            "\0\0\0\x01N"s + "\0\0\0\x04LEAF"s);
}

TEST(SigningInput, WsSessionAndApproverSetAndApprove) {
  EXPECT_EQ(WsSessionSigningInput("n", 7, "L", "gw"),
            "bettercompute.v1/ws-session\0"s + "\0\0\0\x01n"s + "\0\0\0\x08"s +
                "\0\0\0\0\0\0\0\x07"s + "\0\0\0\x01L"s + "\0\0\0\x02gw"s);
  EXPECT_EQ(ApproverSetSigningInput(2, "H", "td"), "bettercompute.v1/approver-set\0"s +
                                                       "\0\0\0\x08"s + "\0\0\0\0\0\0\0\x02"s +
                                                       "\0\0\0\x01H"s + "\0\0\0\x02td"s);
  EXPECT_EQ(ApproveSigningInput("D"), "bettercompute.v1/approve\0"s +
                                          "\0\0\0\x01"
                                          "D"s);
}

TEST(ApproverSetInput, ConcatenatesLengthPrefixedItemsInBundleOrder) {
  v1::TrustBundle bundle;
  bundle.add_approver_keys()->set_spki("K1");
  bundle.add_approver_keys()->set_spki("K22");
  bundle.set_approver_threshold(2);
  auto* tier = bundle.add_quorum_tiers();
  tier->set_min_targets(10);
  tier->set_threshold(3);
  bundle.set_unbatched_destructive_per_hour(5);
  bundle.set_version(99);  // not part of the set
  std::string u32 = "\0\0\0\x04"s;
  EXPECT_EQ(ApproverSetInput(bundle),
            u32 + "\0\0\0\x02"s +                                // n = 2
                "\0\0\0\x02K1"s + "\0\0\0\x03K22"s +             // the keys
                u32 + "\0\0\0\x02"s +                            // threshold
                u32 + "\0\0\0\x01"s +                            // m = 1 tier
                "\0\0\0\x08"s + "\0\0\0\x0a"s + "\0\0\0\x03"s +  // min_targets || threshold
                u32 + "\0\0\0\x05"s);                            // per hour
}

TEST(ApproverSetInput, EmptySetIsStillWellDefined) {
  v1::TrustBundle bundle;
  std::string zero = "\0\0\0\x04\0\0\0\0"s;
  EXPECT_EQ(ApproverSetInput(bundle), zero + zero + zero + zero);
}

}  // namespace
}  // namespace bcd::proto
