// Decodes arbitrary bytes as every message type that arrives from outside. Whatever decodes must
// re-encode (or be refused FRAME_TOO_LARGE: a negative int32 sent as a short varint re-encodes to
// 10 bytes, so a re-encoding can outgrow its input), and re-encoding must be stable.

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "bettercompute/agent/v1/ramdisk.pb.h"
#include "bettercompute/agent/v1/session.pb.h"
#include "bettercompute/agent/v1/tunnel.pb.h"
#include "proto/frame_codec.h"
#include "proto/signing_input.h"

namespace {

namespace v1 = bettercompute::agent::v1;

template <typename T>
void RoundTrip(std::string_view bytes) {
  T message;
  if (!bcd::proto::DecodeMessage(bytes, &message).ok()) return;
  auto encoded = bcd::proto::EncodeMessage(message);
  if (!encoded.ok()) {
    if (bcd::proto::ProtocolErrorOf(encoded.status()) !=
        bcd::proto::ProtocolError::kFrameTooLarge) {
      std::abort();
    }
    return;
  }
  T again;
  if (!bcd::proto::DecodeMessage(*encoded, &again).ok()) std::abort();
  auto twice = bcd::proto::EncodeMessage(again);
  if (!twice.ok() || *twice != *encoded) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  RoundTrip<v1::AgentFrame>(bytes);
  RoundTrip<v1::ServerFrame>(bytes);
  RoundTrip<v1::TunnelFrame>(bytes);
  RoundTrip<v1::JoinRequest>(bytes);
  RoundTrip<v1::JoinResponse>(bytes);
  RoundTrip<v1::JoinResponseBody>(bytes);
  RoundTrip<v1::RenewRequest>(bytes);
  RoundTrip<v1::RenewResponse>(bytes);
  RoundTrip<v1::Command>(bytes);
  RoundTrip<v1::BatchManifest>(bytes);
  RoundTrip<v1::NodeSpec>(bytes);
  RoundTrip<v1::TrustBundle>(bytes);
  RoundTrip<v1::SignedDiscoveryAssertion>(bytes);
  RoundTrip<v1::GatewayProof>(bytes);
  // The signing inputs built from decoded messages.
  v1::ServerFrame frame;
  if (bcd::proto::DecodeMessage(bytes, &frame).ok() && frame.has_trust()) {
    v1::TrustBundle bundle;
    if (bcd::proto::DecodeMessage(frame.trust().body(), &bundle).ok()) {
      (void)bcd::proto::ApproverSetInput(bundle);
    }
  }
  v1::AgentFrame agent;
  if (bcd::proto::DecodeMessage(bytes, &agent).ok() && agent.has_secret_request()) {
    (void)bcd::proto::SecretRequestSigningInput(agent.secret_request());
  }
  return 0;
}
