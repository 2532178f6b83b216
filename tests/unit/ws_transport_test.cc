// The WebSocket transport's pure parts: the proxy from the environment, refusals over HTTP, the
// node's upgrade headers and the gateway proof.

#include <map>

#include "gtest/gtest.h"
#include "pki/base64url.h"
#include "proto/signing_input.h"
#include "testing/dev_pki.h"
#include "transport/proxy.h"
#include "transport/refusal.h"
#include "transport/websocket.h"
#include "transport/ws_auth.h"

namespace bcd::transport {
namespace {

using bcd::testing::DevPki;

EnvLookup Env(std::map<std::string, std::string> values) {
  return [values](const char* name) -> std::optional<std::string> {
    auto it = values.find(name);
    if (it == values.end()) return std::nullopt;
    return it->second;
  };
}

// The gateway serves Join over gRPC only: the WebSocket transport says so and dials nothing.
TEST(WebSocketTransport, RefusesJoinAsGrpcOnly) {
  WebSocketTransport websocket(WebSocketSpec{.host = "192.0.2.1", .port = 443}, nullptr);
  Refusal refusal;
  absl::StatusOr<bettercompute::agent::v1::JoinResponse> joined =
      websocket.Join(bettercompute::agent::v1::JoinRequest(), &refusal);
  EXPECT_EQ(joined.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(std::string(joined.status().message()).find("Join goes over gRPC"), std::string::npos)
      << joined.status();
}

TEST(ProxyUrl, TakesHostPortAndPercentDecodedCredentials) {
  absl::StatusOr<ProxySpec> spec = ParseProxyUrl("http://ops%40site:p%3Ass@proxy.example:3128/");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->host, "proxy.example");
  EXPECT_EQ(spec->port, 3128);
  // base64("ops@site:p:ss")
  EXPECT_EQ(spec->authorization, "Basic b3BzQHNpdGU6cDpzcw==");
  EXPECT_EQ(spec->display, "http://ops@site:***@proxy.example:3128");
}

TEST(ProxyUrl, DefaultsAndForms) {
  EXPECT_EQ(ParseProxyUrl("proxy:8080")->port, 8080);
  EXPECT_EQ(ParseProxyUrl("http://proxy")->port, 80);
  EXPECT_EQ(ParseProxyUrl("http://[fd00::1]:3128")->host, "fd00::1");
  EXPECT_TRUE(ParseProxyUrl("http://proxy")->authorization.empty());
  EXPECT_EQ(ParseProxyUrl("http://user@proxy")->authorization, "Basic dXNlcjo=");
}

TEST(ProxyUrl, RefusesWhatItCannotSpeak) {
  EXPECT_NE(std::string(ParseProxyUrl("socks5://proxy:1080").status().message())
                .find("scheme \"socks5\" is not supported"),
            std::string::npos);
  EXPECT_FALSE(ParseProxyUrl("https://proxy:443").ok());
  EXPECT_FALSE(ParseProxyUrl("http://proxy:0").ok());
  EXPECT_FALSE(ParseProxyUrl("http://proxy:99999").ok());
  EXPECT_FALSE(ParseProxyUrl("http://proxy/path").ok());
  EXPECT_FALSE(ParseProxyUrl("http://us%zzer@proxy").ok());
  EXPECT_FALSE(ParseProxyUrl("http://").ok());
  EXPECT_FALSE(ParseProxyUrl("http://pro xy").ok());
}

TEST(NoProxy, MatchesNamesSuffixesAddressesBlocksAndPorts) {
  EXPECT_TRUE(NoProxyMatches("*", "anything", 443));
  EXPECT_TRUE(NoProxyMatches("example.com", "example.com", 443));
  EXPECT_TRUE(NoProxyMatches("example.com", "gw.example.com", 443));
  EXPECT_TRUE(NoProxyMatches(".example.com", "gw.example.com", 443));
  EXPECT_TRUE(NoProxyMatches(" other.net , EXAMPLE.com ", "gw.example.com.", 443));
  EXPECT_FALSE(NoProxyMatches("example.com", "badexample.com", 443));
  EXPECT_FALSE(NoProxyMatches("gw.example.com", "example.com", 443));
  EXPECT_TRUE(NoProxyMatches("10.1.2.3", "10.1.2.3", 443));
  EXPECT_FALSE(NoProxyMatches("10.1.2.3", "10.1.2.4", 443));
  EXPECT_TRUE(NoProxyMatches("10.0.0.0/8", "10.200.1.1", 443));
  EXPECT_FALSE(NoProxyMatches("10.0.0.0/8", "11.0.0.1", 443));
  EXPECT_TRUE(NoProxyMatches("fd00::/8", "fd12::1", 443));
  EXPECT_TRUE(NoProxyMatches("[::1]", "::1", 443));
  EXPECT_TRUE(NoProxyMatches("gw.example.com:443", "gw.example.com", 443));
  EXPECT_FALSE(NoProxyMatches("gw.example.com:8443", "gw.example.com", 443));
  EXPECT_FALSE(NoProxyMatches("", "gw.example.com", 443));
  EXPECT_FALSE(NoProxyMatches("10.0.0.0/99", "10.0.0.1", 443));
}

TEST(ProxyFor, ReadsTheEnvironmentLikeCurl) {
  EXPECT_FALSE(ProxyFor("gw", 443, Env({}))->has_value());
  EXPECT_EQ((*ProxyFor("gw", 443, Env({{"https_proxy", "http://p:1"}})))->host, "p");
  EXPECT_EQ((*ProxyFor("gw", 443, Env({{"HTTPS_PROXY", "http://q:1"}})))->host, "q");
  EXPECT_EQ(
      (*ProxyFor("gw", 443, Env({{"https_proxy", "http://p:1"}, {"HTTPS_PROXY", "q:1"}})))->host,
      "p");
  EXPECT_FALSE(
      ProxyFor("gw", 443, Env({{"https_proxy", "http://p:1"}, {"no_proxy", "gw"}}))->has_value());
  EXPECT_FALSE(
      ProxyFor("gw", 443, Env({{"https_proxy", "http://p:1"}, {"NO_PROXY", "gw"}}))->has_value());
  absl::Status bad = ProxyFor("gw", 443, Env({{"HTTPS_PROXY", "socks5://p"}})).status();
  EXPECT_NE(std::string(bad.message()).find("HTTPS_PROXY: "), std::string::npos) << bad;
}

TEST(RefusalOfHttp, MapsStatusReasonAndPushback) {
  Refusal r = RefusalOfHttp(403, {{"x-bc-reason", "revoked"}}, "HTTP 403");
  EXPECT_EQ(r.code, grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(r.NeedsPerson());
  EXPECT_FALSE(r.pushback.has_value());
  r = RefusalOfHttp(503, {{"retry-after", "7"}}, "busy");
  EXPECT_EQ(r.code, grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(r.pushback, std::chrono::seconds(7));
  r = RefusalOfHttp(429, {{"grpc-retry-pushback-ms", "2500"}, {"retry-after", "7"}}, "slow down");
  EXPECT_EQ(r.pushback, std::chrono::milliseconds(2500));
  r = RefusalOfHttp(400, {{"grpc-status", "8"}, {"grpc-message", "too many"}}, "HTTP 400");
  EXPECT_EQ(r.code, grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(r.message, "too many");
  r = RefusalOfHttp(500, {{"grpc-status", "0"}, {"retry-after", "soon"}}, "odd");
  EXPECT_NE(r.code, grpc::StatusCode::OK);  // an error answer is never a success
  EXPECT_FALSE(r.pushback.has_value());
}

TEST(RefusalOfHttp, PushbackIsSaturatedAndClampedToOneSecondToOneHour) {
  using std::chrono::milliseconds;
  auto pushback = [](std::string name, std::string value) {
    return RefusalOfHttp(503, {{name, value}}, "busy").pushback;
  };
  // 0 would make the redial loop hot; a huge value (or one that overflows when converted) would
  // make bcd never come back.
  EXPECT_EQ(pushback("grpc-retry-pushback-ms", "0"), milliseconds(1000));
  EXPECT_EQ(pushback("retry-after", "0"), milliseconds(1000));
  EXPECT_EQ(pushback("grpc-retry-pushback-ms", "250"), milliseconds(1000));
  EXPECT_EQ(pushback("retry-after", "86400"), milliseconds(3600 * 1000));
  EXPECT_EQ(pushback("retry-after", "9223372036854775807"), milliseconds(3600 * 1000));
  EXPECT_EQ(pushback("grpc-retry-pushback-ms", "99999999999999999999999999"),
            milliseconds(3600 * 1000));
  EXPECT_EQ(pushback("retry-after", "18446744073709551616"), milliseconds(3600 * 1000));
  for (const char* bad : {"-1", "1e3", " 5", "5s", ""}) {
    EXPECT_FALSE(pushback("retry-after", bad).has_value()) << bad;
  }
  EXPECT_EQ(ParsePushback("3599999", false), milliseconds(3599999));
}

class WsAuth : public ::testing::Test {
 protected:
  static constexpr int64_t kNow = 1'800'000'000;
  WsAuth()
      : pki_(*DevPki::Create(kNow - 100)),
        node_key_(*pki::PrivateKey::Generate()),
        node_leaf_(*pki_.IssueNode(node_key_.Public(), "n-1", 1, kNow - 100, 86400)) {}

  GatewayProofCheck Check() const {
    return {.ca_spki_sha256 = pki_.serving_ca().SpkiSha256(),
            .server_name = DevPki::kGatewayName,
            .node_id = "n-1",
            .nonce = std::string(16, 'x'),
            .now = kNow};
  }
  std::string Proof(std::string node = "n-1", std::string nonce = std::string(16, 'x'),
                    int64_t iat = kNow) const {
    return *MakeGatewayProof(
        pki_.serving_key(), {pki_.serving_leaf().Der(), pki_.serving_ca().Der()}, node, nonce, iat);
  }
  std::string Message(absl::Status status) const { return std::string(status.message()); }

  DevPki pki_;
  pki::PrivateKey node_key_;
  pki::Certificate node_leaf_;
};

TEST_F(WsAuth, AGatewayProofVerifies) {
  EXPECT_TRUE(VerifyGatewayProof(Proof(), Check()).ok());
  EXPECT_TRUE(VerifyGatewayProof(Proof("n-1", std::string(16, 'x'), kNow - 60), Check()).ok());
  EXPECT_TRUE(VerifyGatewayProof(Proof("n-1", std::string(16, 'x'), kNow + 60), Check()).ok());
}

TEST_F(WsAuth, AGatewayProofIsRefusedNamingWhy) {
  EXPECT_EQ(VerifyGatewayProof(Proof(), Check()).code(), absl::StatusCode::kOk);
  EXPECT_NE(Message(VerifyGatewayProof("", Check())).find("carries no x-bc-gateway-proof"),
            std::string::npos);
  EXPECT_NE(Message(VerifyGatewayProof("!!", Check())).find("not base64url"), std::string::npos);
  EXPECT_NE(Message(VerifyGatewayProof(std::string(40000, 'A'), Check())).find("over 32 KiB"),
            std::string::npos);
  EXPECT_NE(Message(VerifyGatewayProof(pki::Base64UrlEncode("\xff\xff"), Check()))
                .find("not a SignedEnvelope"),
            std::string::npos);
  EXPECT_NE(Message(VerifyGatewayProof(Proof("n-2"), Check())).find("names node \"n-2\""),
            std::string::npos);
  EXPECT_NE(Message(VerifyGatewayProof(Proof("n-1", std::string(16, 'y')), Check()))
                .find("another nonce"),
            std::string::npos);
  EXPECT_NE(Message(VerifyGatewayProof(Proof("n-1", std::string(16, 'x'), kNow - 61), Check()))
                .find("not within 60 s"),
            std::string::npos);
  // A proof from the future is no fresher than one from the past.
  EXPECT_EQ(Message(VerifyGatewayProof(Proof("n-1", std::string(16, 'x'), kNow + 61), Check())),
            "gateway proof refused: its iat 1800000061 is not within 60 s of this node's "
            "clock (1800000000)");
  GatewayProofCheck other_name = Check();
  other_name.server_name = "gw.elsewhere.test";
  EXPECT_NE(Message(VerifyGatewayProof(Proof(), other_name)).find("not valid for the name"),
            std::string::npos);
  GatewayProofCheck other_pin = Check();
  other_pin.ca_spki_sha256 = std::string(32, '\0');
  EXPECT_NE(Message(VerifyGatewayProof(Proof(), other_pin)).find("does not lead to the pinned CA"),
            std::string::npos);
  // Signed by the node CA's key rather than the serving leaf's: the chain says serving leaf.
  std::string forged =
      *MakeGatewayProof(node_key_, {pki_.serving_leaf().Der(), pki_.serving_ca().Der()}, "n-1",
                        std::string(16, 'x'), kNow);
  EXPECT_NE(Message(VerifyGatewayProof(forged, Check())).find("its signature"), std::string::npos);
}

TEST_F(WsAuth, TheChainHeaderRoundTrips) {
  std::vector<pki::Certificate> chain = {node_leaf_, pki_.node_ca()};
  absl::StatusOr<std::vector<pki::Certificate>> back = DecodeChainHeader(EncodeChainHeader(chain));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0].Der(), node_leaf_.Der());
  EXPECT_EQ((*back)[1].Der(), pki_.node_ca().Der());
  EXPECT_FALSE(DecodeChainHeader("").ok());
  EXPECT_FALSE(DecodeChainHeader(pki::Base64UrlEncode(std::string("\0\0\0\x09"
                                                                  "abc",
                                                                  7)))
                   .ok());
}

TEST_F(WsAuth, TheNodeUpgradeHeadersVerifyForTheirHostAndTime) {
  absl::StatusOr<NodeUpgradeHeaders> made =
      MakeNodeUpgradeHeaders(node_key_, {node_leaf_, pki_.node_ca()}, "gw.dev.test", kNow);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ(made->nonce.size(), 16u);
  // The proof is ES256 over signing_input("ws-session", [nonce, time, leaf, host]).
  EXPECT_TRUE(node_key_.Public()
                  .VerifyEs256(proto::WsSessionSigningInput(made->nonce, kNow, node_leaf_.Der(),
                                                            "gw.dev.test"),
                               *pki::Base64UrlDecode(made->headers["x-bc-node-proof"]))
                  .ok());
  absl::StatusOr<UpgradingNode> node =
      VerifyNodeUpgrade(made->headers, {pki_.node_ca()}, "gw.dev.test", kNow + 30);
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(node->identity.id.node(), "n-1");
  EXPECT_EQ(node->nonce, made->nonce);
  EXPECT_FALSE(VerifyNodeUpgrade(made->headers, {pki_.node_ca()}, "gw.other.test", kNow).ok());
  EXPECT_FALSE(VerifyNodeUpgrade(made->headers, {pki_.node_ca()}, "gw.dev.test", kNow + 61).ok());
  EXPECT_FALSE(VerifyNodeUpgrade(made->headers, {pki_.serving_ca()}, "gw.dev.test", kNow).ok());
  auto missing = made->headers;
  missing.erase("x-bc-node-proof");
  EXPECT_NE(Message(VerifyNodeUpgrade(missing, {pki_.node_ca()}, "gw.dev.test", kNow).status())
                .find("no x-bc-node-proof"),
            std::string::npos);
}

}  // namespace
}  // namespace bcd::transport
