#include "transport/ws_auth.h"

#include <charconv>
#include <cstdlib>

#include "bettercompute/agent/v1/session.pb.h"
#include "fmt/format.h"
#include "pki/base64url.h"
#include "pki/envelope.h"
#include "proto/absl_compat.h"
#include "proto/frame_codec.h"
#include "proto/signing_input.h"
#include "transport/tls.h"

namespace bcd::transport {

namespace v1 = bettercompute::agent::v1;

namespace {

constexpr std::size_t kMaxProofHeader = 32 * 1024;
constexpr std::size_t kMaxChainHeader = 32 * 1024;
constexpr std::size_t kMaxChainLength = 8;

absl::Status Refuse(std::string why) {
  return absl::UnauthenticatedError("gateway proof refused: " + why);
}

}  // namespace

std::string EncodeChainHeader(const std::vector<pki::Certificate>& chain) {
  std::string joined;
  for (const pki::Certificate& cert : chain) {
    joined += proto::Uint32Be(static_cast<uint32_t>(cert.Der().size()));
    joined += cert.Der();
  }
  return pki::Base64UrlEncode(joined);
}

absl::StatusOr<std::vector<pki::Certificate>> DecodeChainHeader(std::string_view header) {
  if (header.size() > kMaxChainHeader) {
    return absl::InvalidArgumentError("x-bc-node-chain is over 32 KiB");
  }
  std::optional<std::string> joined = pki::Base64UrlDecode(header);
  if (!joined) return absl::InvalidArgumentError("x-bc-node-chain is not base64url");
  std::vector<std::string> der;
  std::string_view rest = *joined;
  while (!rest.empty()) {
    if (rest.size() < 4 || der.size() == kMaxChainLength) {
      return absl::InvalidArgumentError("x-bc-node-chain is not a list of parts");
    }
    uint32_t length = (static_cast<uint32_t>(static_cast<uint8_t>(rest[0])) << 24) |
                      (static_cast<uint32_t>(static_cast<uint8_t>(rest[1])) << 16) |
                      (static_cast<uint32_t>(static_cast<uint8_t>(rest[2])) << 8) |
                      static_cast<uint32_t>(static_cast<uint8_t>(rest[3]));
    rest.remove_prefix(4);
    if (length > rest.size()) return absl::InvalidArgumentError("x-bc-node-chain is truncated");
    der.emplace_back(rest.substr(0, length));
    rest.remove_prefix(length);
  }
  if (der.empty()) return absl::InvalidArgumentError("x-bc-node-chain is empty");
  return pki::ParseDerChain(der);
}

absl::StatusOr<NodeUpgradeHeaders> MakeNodeUpgradeHeaders(
    const pki::PrivateKey& key, const std::vector<pki::Certificate>& chain, std::string_view host,
    int64_t now) {
  if (chain.empty()) return absl::InvalidArgumentError("no node certificate chain");
  NodeUpgradeHeaders out;
  out.nonce = pki::RandomBytes(16);
  absl::StatusOr<std::string> proof = key.SignEs256(proto::WsSessionSigningInput(
      out.nonce, static_cast<uint64_t>(now), chain.front().Der(), host));
  if (!proof.ok()) return proof.status();
  out.headers["x-bc-node-chain"] = EncodeChainHeader(chain);
  out.headers["x-bc-nonce"] = pki::Base64UrlEncode(out.nonce);
  out.headers["x-bc-time"] = std::to_string(now);
  out.headers["x-bc-node-proof"] = pki::Base64UrlEncode(*proof);
  return out;
}

absl::Status VerifyGatewayProof(std::string_view header, const GatewayProofCheck& check) {
  if (header.empty()) return Refuse("the 101 carries no x-bc-gateway-proof");
  if (header.size() > kMaxProofHeader) return Refuse("x-bc-gateway-proof is over 32 KiB");
  std::optional<std::string> bytes = pki::Base64UrlDecode(header);
  if (!bytes) return Refuse("x-bc-gateway-proof is not base64url");
  bettercompute::common::v1::SignedEnvelope envelope;
  if (absl::Status s = proto::DecodeMessage(*bytes, &envelope); !s.ok()) {
    return Refuse(
        fmt::format("x-bc-gateway-proof is not a SignedEnvelope: {}", ToStd(s.message())));
  }
  absl::StatusOr<std::vector<pki::Certificate>> chain = pki::ParseDerChain(
      {envelope.signature().chain().begin(), envelope.signature().chain().end()});
  if (!chain.ok()) {
    return Refuse(fmt::format("its certificate chain: {}", ToStd(chain.status().message())));
  }
  if (chain->size() > kMaxChainLength) return Refuse("its certificate chain is too long");
  if (absl::Status s = CheckPinnedChain(*chain, check.ca_spki_sha256, check.server_name, check.now);
      !s.ok()) {
    return Refuse(std::string(ToStd(s.message())));
  }
  const pki::Certificate* anchor = nullptr;
  for (const pki::Certificate& cert : *chain) {
    if (cert.SpkiSha256() == check.ca_spki_sha256) anchor = &cert;
  }
  if (absl::Status s = pki::VerifyWithChain(
          proto::BodySigningInput(proto::Purpose::kGatewayProof, envelope.body()),
          envelope.signature(), {*anchor}, check.now);
      !s.ok()) {
    return Refuse(fmt::format("its signature: {}", ToStd(s.message())));
  }
  v1::GatewayProof proof;
  if (absl::Status s = proto::DecodeMessage(envelope.body(), &proof); !s.ok()) {
    return Refuse(fmt::format("its body is not a GatewayProof: {}", ToStd(s.message())));
  }
  if (proof.node_id() != check.node_id) {
    return Refuse(
        fmt::format("it names node \"{}\", this node is \"{}\"", proof.node_id(), check.node_id));
  }
  if (proof.nonce() != check.nonce) return Refuse("it echoes another nonce");
  int64_t iat = static_cast<int64_t>(std::min<uint64_t>(proof.iat(), INT64_MAX));
  if (iat > check.now + kProofSkewSeconds || iat < check.now - kProofSkewSeconds) {
    return Refuse(fmt::format("its iat {} is not within {} s of this node's clock ({})",
                              proof.iat(), kProofSkewSeconds, check.now));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> MakeGatewayProof(const pki::PrivateKey& serving_key,
                                             const std::vector<std::string>& serving_chain_der,
                                             std::string_view node_id, std::string_view nonce,
                                             int64_t iat) {
  v1::GatewayProof proof;
  proof.set_node_id(std::string(node_id));
  proof.set_nonce(std::string(nonce));
  proof.set_iat(static_cast<uint64_t>(iat));
  bettercompute::common::v1::SignedEnvelope envelope;
  envelope.set_body(proof.SerializeAsString());
  absl::StatusOr<bettercompute::common::v1::Signature> signature =
      pki::Sign(proto::BodySigningInput(proto::Purpose::kGatewayProof, envelope.body()),
                serving_key, "gateway", serving_chain_der);
  if (!signature.ok()) return signature.status();
  *envelope.mutable_signature() = *signature;
  return pki::Base64UrlEncode(envelope.SerializeAsString());
}

absl::StatusOr<UpgradingNode> VerifyNodeUpgrade(const std::map<std::string, std::string>& headers,
                                                const std::vector<pki::Certificate>& node_cas,
                                                std::string_view host, int64_t now) {
  auto get = [&](const char* name) -> std::string_view {
    auto it = headers.find(name);
    return it == headers.end() ? std::string_view() : std::string_view(it->second);
  };
  for (const char* name : {"x-bc-node-chain", "x-bc-nonce", "x-bc-time", "x-bc-node-proof"}) {
    if (get(name).empty()) {
      return absl::UnauthenticatedError(fmt::format("the upgrade carries no {}", name));
    }
  }
  absl::StatusOr<std::vector<pki::Certificate>> chain = DecodeChainHeader(get("x-bc-node-chain"));
  if (!chain.ok()) return absl::UnauthenticatedError(std::string(ToStd(chain.status().message())));
  if (absl::Status s = pki::VerifyChain(*chain, node_cas, now); !s.ok()) {
    return absl::PermissionDeniedError(fmt::format("the node chain: {}", ToStd(s.message())));
  }
  absl::StatusOr<pki::NodeIdentity> identity = pki::IdentityOf(chain->front());
  if (!identity.ok())
    return absl::PermissionDeniedError(std::string(ToStd(identity.status().message())));
  std::optional<std::string> nonce = pki::Base64UrlDecode(get("x-bc-nonce"));
  if (!nonce || nonce->size() != 16) {
    return absl::UnauthenticatedError("x-bc-nonce is not base64url of 16 bytes");
  }
  int64_t time = 0;
  std::string_view text = get("x-bc-time");
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), time);
  if (ec != std::errc() || end != text.data() + text.size() ||
      std::llabs(static_cast<long long>(time) - now) > kProofSkewSeconds) {
    return absl::UnauthenticatedError("x-bc-time is not within 60 s of the gateway's clock");
  }
  std::optional<std::string> proof = pki::Base64UrlDecode(get("x-bc-node-proof"));
  absl::StatusOr<pki::PublicKey> key = chain->front().Key();
  if (!proof || !key.ok() ||
      !key->VerifyEs256(proto::WsSessionSigningInput(*nonce, static_cast<uint64_t>(time),
                                                     chain->front().Der(), host),
                        *proof)
           .ok()) {
    return absl::UnauthenticatedError("x-bc-node-proof does not verify with the node's leaf");
  }
  return UpgradingNode{*std::move(chain), *std::move(identity), *std::move(nonce)};
}

}  // namespace bcd::transport
