// Makes bcd's side of the interop check: ES256 signatures over signing inputs, a JWE sealed to the
// Node fixtures' recipient, a tunnel ticket and its JWKS, a CSR, and the WebSocket upgrade's node
// headers and gateway proof, for check-ours.mjs and `openssl req -verify` to accept or refuse.
//
//   pki_interop_produce NODE_FIXTURES.json OURS.json OURS_CSR.der

#include <cstdio>
#include <fstream>
#include <sstream>

#include "nlohmann/json.hpp"
#include "pki/base64url.h"
#include "pki/jwe.h"
#include "pki/jwt.h"
#include "pki/keys.h"
#include "pki/x509.h"
#include "proto/signing_input.h"
#include "testing/dev_pki.h"
#include "transport/ws_auth.h"

namespace {

template <typename T>
T Must(absl::StatusOr<T> value) {
  if (!value.ok()) {
    std::fprintf(stderr, "pki_interop_produce: %s\n",
                 std::string(value.status().message()).c_str());
    std::exit(1);
  }
  return *std::move(value);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace bcd;
  if (argc != 4) {
    std::fprintf(stderr, "usage: pki_interop_produce NODE_FIXTURES.json OURS.json OURS_CSR.der\n");
    return 2;
  }
  std::ifstream in(argv[1]);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json fixtures = nlohmann::json::parse(text.str());
  constexpr int64_t kNow = 1800000000;

  pki::PrivateKey key = Must(pki::PrivateKey::Generate());
  nlohmann::json out;
  out["spki"] = pki::Hex(key.Public().SpkiDer());
  out["now"] = kNow;
  bettercompute::agent::v1::RenewRequest renew;
  renew.set_csr("csr");
  renew.set_timestamp(kNow);
  renew.set_nonce(pki::RandomBytes(16));
  renew.add_chain("leaf");
  for (const auto& [purpose, input] : std::vector<std::pair<std::string, std::string>>{
           {"command", proto::BodySigningInput(proto::Purpose::kCommand, "body")},
           {"renew", proto::RenewSigningInput(renew)},
           {"ws-session",
            proto::WsSessionSigningInput(pki::RandomBytes(16), kNow, "leaf", "gw.example.net")}}) {
    out["signatures"].push_back({{"purpose", purpose},
                                 {"input", pki::Hex(input)},
                                 {"sig", pki::Hex(Must(key.SignEs256(input)))}});
  }

  pki::PrivateKey recipient =
      Must(pki::PrivateKey::FromPem(fixtures["recipient_pkcs8"].get<std::string>()));
  out["jwe_plaintext"] = "correct horse battery staple";
  out["jwe"] =
      Must(pki::SealJwe("correct horse battery staple", recipient.Public(), pki::kSecretJweType,
                        {{"ref", "secret://db/password"}, {"rid", "r-1"}}, kNow + 600));

  pki::PrivateKey ticket_key = Must(pki::PrivateKey::Generate());
  nlohmann::json claims = {{"aud", "node:n-1"}, {"jti", "ours-1"}, {"iat", kNow},
                           {"exp", kNow + 60},  {"sid", "sess-1"}, {"tid", "tun-1"},
                           {"op", "exec"},      {"cmd", {"id"}}};
  out["jwt"] = Must(pki::SignJwt(claims.dump(), ticket_key, "bcd-1"));
  out["jwks"] = pki::JwksOf(ticket_key.Public(), "bcd-1");

  // The WebSocket upgrade: the node's x-bc-node-* headers and a gateway proof, with the
  // certificates Node should find in them.
  testing::DevPki dev = Must(testing::DevPki::Create(kNow - 60));
  pki::PrivateKey node_key = Must(pki::PrivateKey::Generate());
  pki::Certificate node_leaf = Must(dev.IssueNode(node_key.Public(), "n-1", 1, kNow - 60, 3600));
  transport::NodeUpgradeHeaders upgrade = Must(transport::MakeNodeUpgradeHeaders(
      node_key, {node_leaf, dev.node_ca()}, "gw.example.net", kNow));
  out["ws"]["host"] = "gw.example.net";
  out["ws"]["headers"] = upgrade.headers;
  out["ws"]["leaf"] = pki::Hex(node_leaf.Der());
  out["ws"]["node_ca"] = pki::Hex(dev.node_ca().Der());
  out["ws"]["gateway_proof"] = Must(transport::MakeGatewayProof(
      dev.serving_key(), {dev.serving_leaf().Der(), dev.serving_ca().Der()}, "n-1", upgrade.nonce,
      kNow));
  out["ws"]["serving_leaf"] = pki::Hex(dev.serving_leaf().Der());
  out["ws"]["serving_ca"] = pki::Hex(dev.serving_ca().Der());

  std::ofstream(argv[2]) << out.dump(1) << "\n";
  std::ofstream(argv[3], std::ios::binary) << Must(pki::CreateCsr(key, "n-1"));
  return 0;
}
