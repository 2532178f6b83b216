#pragma once

// Authentication on the WebSocket transport, both ways, without a TLS client certificate (a
// TLS-inspecting proxy strips it):
// - the node: its chain and a proof of possession over a fresh nonce, the time and the host, in
//   the upgrade request's x-bc-node-* headers;
// - the gateway: the 101's x-bc-gateway-proof, a SignedEnvelope over GatewayProof {node_id, nonce,
//   iat} by its serving leaf, which must chain to the pinned serving CA. A proxy can terminate TLS
//   but cannot make this proof.
// Pure functions over bytes and headers; the Beast code in websocket.cc only carries them.

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "pki/keys.h"
#include "pki/x509.h"

namespace bcd::transport {

inline constexpr std::string_view kWsSubprotocol = "bettercompute.agent.v1";
inline constexpr std::size_t kMaxWsMessage = 16 * 1024 * 1024;
inline constexpr int64_t kProofSkewSeconds = 60;

// The upgrade request's x-bc-node-chain, x-bc-nonce, x-bc-time and x-bc-node-proof headers.
struct NodeUpgradeHeaders {
  std::string nonce;  // the 16 raw bytes the gateway proof must echo
  std::map<std::string, std::string> headers;
};
absl::StatusOr<NodeUpgradeHeaders> MakeNodeUpgradeHeaders(
    const pki::PrivateKey& key, const std::vector<pki::Certificate>& chain, std::string_view host,
    int64_t now);

// What the client knows when it checks the 101.
struct GatewayProofCheck {
  std::string ca_spki_sha256;  // 32 bytes: the pinned serving CA
  std::string server_name;     // the name the serving leaf must carry
  std::string node_id;
  std::string nonce;
  int64_t now = 0;
};
// OK when `header` (x-bc-gateway-proof as received) proves the gateway; else Unauthenticated,
// naming what failed. Bounded: a header over 32 KiB is refused before decoding.
absl::Status VerifyGatewayProof(std::string_view header, const GatewayProofCheck& check);

// The gateway side (the dev gateway; a real gateway does the same in its own code).
absl::StatusOr<std::string> MakeGatewayProof(const pki::PrivateKey& serving_key,
                                             const std::vector<std::string>& serving_chain_der,
                                             std::string_view node_id, std::string_view nonce,
                                             int64_t iat);
struct UpgradingNode {
  std::vector<pki::Certificate> chain;
  pki::NodeIdentity identity;
  std::string nonce;
};
// Checks the x-bc-node-* headers (lower-case names) against the node CAs, the host the request
// was for and the clock: the chain verifies, the time is within 60 s, the proof verifies with the
// leaf. The caller keeps the replay cache of nonces.
absl::StatusOr<UpgradingNode> VerifyNodeUpgrade(const std::map<std::string, std::string>& headers,
                                                const std::vector<pki::Certificate>& node_cas,
                                                std::string_view host, int64_t now);

// The DER chain as x-bc-node-chain carries it: each certificate as a part (uint32_be(len) ||
// bytes), base64url without padding.
std::string EncodeChainHeader(const std::vector<pki::Certificate>& chain);
absl::StatusOr<std::vector<pki::Certificate>> DecodeChainHeader(std::string_view header);

}  // namespace bcd::transport
