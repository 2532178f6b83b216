// The WebSocket transport's own parsers, on arbitrary bytes. The first byte picks one:
//   0  x-bc-gateway-proof as received in a 101
//   1  the x-bc-node-* upgrade headers as the dev gateway reads them (lines: chain, nonce, time,
//      proof)
//   2  a proxy URL and a no_proxy list ("URL|LIST|HOST"), and the refusal headers of an answer
//      (the pushback taken must stay within 1 s..1 h)
//   3  edits (position, xor) applied to a valid gateway proof, then checked: reaches every check
//      past decoding
// Nothing may crash or leak, and no proof with another body may verify.

#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>

#include "bettercompute/common/v1/common.pb.h"
#include "pki/base64url.h"
#include "testing/dev_pki.h"
#include "transport/proxy.h"
#include "transport/refusal.h"
#include "transport/ws_auth.h"

namespace {

struct Fixture {
  bcd::testing::DevPki pki = *bcd::testing::DevPki::Create(1'700'000'000);
  std::string nonce = std::string(16, 'n');
  std::string proof_bytes;
  bcd::transport::GatewayProofCheck check;
  Fixture() {
    std::string header = *bcd::transport::MakeGatewayProof(
        pki.serving_key(), {pki.serving_leaf().Der(), pki.serving_ca().Der()}, "n-1", nonce,
        1'700'000'010);
    proof_bytes = *bcd::pki::Base64UrlDecode(header);
    check = {.ca_spki_sha256 = pki.serving_ca().SpkiSha256(),
             .server_name = bcd::testing::DevPki::kGatewayName,
             .node_id = "n-1",
             .nonce = nonce,
             .now = 1'700'000'020};
  }
};

std::vector<std::string_view> Split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  while (true) {
    std::size_t at = text.find(separator);
    parts.push_back(text.substr(0, at));
    if (at == std::string_view::npos) return parts;
    text.remove_prefix(at + 1);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture* fixture = new Fixture();
  if (size == 0) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
      if (bcd::transport::VerifyGatewayProof(rest, fixture->check).ok()) std::abort();
      break;
    case 1: {
      std::vector<std::string_view> lines = Split(rest, '\n');
      std::map<std::string, std::string> headers;
      const char* names[] = {"x-bc-node-chain", "x-bc-nonce", "x-bc-time", "x-bc-node-proof"};
      for (std::size_t i = 0; i < lines.size() && i < 4; ++i) headers[names[i]] = lines[i];
      (void)bcd::transport::DecodeChainHeader(headers[names[0]]);
      (void)bcd::transport::VerifyNodeUpgrade(headers, {fixture->pki.node_ca()}, "gw.dev.test",
                                              1'700'000'000);
      break;
    }
    case 2: {
      std::vector<std::string_view> parts = Split(rest, '|');
      (void)bcd::transport::ParseProxyUrl(parts[0]);
      if (parts.size() > 2) (void)bcd::transport::NoProxyMatches(parts[1], parts[2], 443);
      std::map<std::string, std::string> headers;
      for (std::size_t i = 1; i + 1 < parts.size(); i += 2) {
        headers[std::string(parts[i])] = std::string(parts[i + 1]);
      }
      headers["retry-after"] = std::string(parts.back());
      headers["grpc-status"] = std::string(parts[0].substr(0, 3));
      bcd::transport::Refusal refusal = bcd::transport::RefusalOfHttp(429, headers, "refused");
      // Whatever a server (or a proxy) says, the delay taken is within its bounds.
      if (refusal.pushback && (*refusal.pushback < bcd::transport::kMinPushback ||
                               *refusal.pushback > bcd::transport::kMaxPushback)) {
        abort();
      }
      for (bool seconds : {false, true}) {
        auto delay = bcd::transport::ParsePushback(parts.back(), seconds);
        if (delay &&
            (*delay < bcd::transport::kMinPushback || *delay > bcd::transport::kMaxPushback)) {
          abort();
        }
      }
      break;
    }
    case 3: {
      std::string bytes = fixture->proof_bytes;
      for (std::size_t i = 0; i + 1 < rest.size(); i += 2) {
        bytes[static_cast<uint8_t>(rest[i]) * 7 % bytes.size()] ^= rest[i + 1];
      }
      bool valid =
          bcd::transport::VerifyGatewayProof(bcd::pki::Base64UrlEncode(bytes), fixture->check).ok();
      if (valid) {
        // Only edits outside what is signed (the kid, say) may still verify.
        bettercompute::common::v1::SignedEnvelope edited, original;
        if (!edited.ParseFromString(bytes) || !original.ParseFromString(fixture->proof_bytes) ||
            edited.body() != original.body()) {
          std::abort();
        }
      }
      break;
    }
  }
  return 0;
}
