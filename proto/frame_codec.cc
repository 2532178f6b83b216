#include "proto/frame_codec.h"

#include <string_view>
#include <unordered_map>

#include "absl/strings/cord.h"
#include "fmt/format.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/reflection.h"
#include "google/protobuf/unknown_field_set.h"
#include "proto/absl_compat.h"

namespace bcd::proto {
namespace {

constexpr std::string_view kErrorPayloadUrl = "type.bettercompute.dev/bcd.ProtocolError";
constexpr std::size_t kKiB = 1024;
constexpr std::size_t kMiB = 1024 * kKiB;

// Bounds by message type. A frame bound covers everything nested in it, so an inner body decoded
// from a frame's bytes never needs more than its frame allowed.
const std::unordered_map<std::string_view, std::size_t>& Bounds() {
  static const auto* bounds = new std::unordered_map<std::string_view, std::size_t>{
      // Session frames: bulk data never rides the session (logs and images go by URL).
      {"bettercompute.agent.v1.AgentFrame", 4 * kMiB},
      {"bettercompute.agent.v1.ServerFrame", 4 * kMiB},
      {"bettercompute.agent.v1.TunnelFrame", 1 * kMiB},
      // Join and renew travel before a session exists; the renew bound is the protocol's 64 KiB.
      {"bettercompute.agent.v1.JoinRequest", 256 * kKiB},
      {"bettercompute.agent.v1.JoinResponse", 256 * kKiB},
      {"bettercompute.agent.v1.JoinResponseBody", 256 * kKiB},
      {"bettercompute.agent.v1.RenewRequest", 64 * kKiB},
      {"bettercompute.agent.v1.RenewResponse", 256 * kKiB},
      // Signed bodies inside frames.
      {"bettercompute.agent.v1.SignedSpec", 4 * kMiB},
      {"bettercompute.agent.v1.NodeSpec", 4 * kMiB},
      {"bettercompute.agent.v1.SignedCommand", 4 * kMiB},
      {"bettercompute.agent.v1.Command", 1 * kMiB},
      {"bettercompute.agent.v1.BatchManifest", 2 * kMiB},
      {"bettercompute.agent.v1.SignedTrustBundle", 1 * kMiB},
      {"bettercompute.agent.v1.TrustBundle", 1 * kMiB},
      {"bettercompute.common.v1.HardwareClaims", 1 * kMiB},
      // Small envelopes that arrive in headers or as join evidence.
      {"bettercompute.common.v1.SignedEnvelope", 64 * kKiB},
      {"bettercompute.agent.v1.GatewayProof", 1 * kKiB},
      {"bettercompute.agent.v1.SignedDiscoveryAssertion", 64 * kKiB},
      {"bettercompute.agent.v1.DiscoveryAssertion", 4 * kKiB},
  };
  return *bounds;
}

absl::Status WithError(absl::Status status, ProtocolError error) {
  status.SetPayload(ToAbsl(kErrorPayloadUrl), absl::Cord(ToAbsl(ProtocolErrorName(error))));
  return status;
}

absl::Status TooLarge(const google::protobuf::Descriptor& type, std::size_t size) {
  return WithError(absl::ResourceExhaustedError(
                       fmt::format("FRAME_TOO_LARGE: {} of {} bytes is over its bound of {} bytes",
                                   type.full_name(), size, MessageBound(type))),
                   ProtocolError::kFrameTooLarge);
}

absl::Status Invalid(const google::protobuf::Descriptor& type, std::string_view why) {
  return WithError(
      absl::InvalidArgumentError(fmt::format("INVALID_FRAME: {}: {}", type.full_name(), why)),
      ProtocolError::kInvalidFrame);
}

// Protobuf keeps a known field number that arrives with the wrong wire type as an unknown field.
// For us that is a malformed message, not a newer peer: refuse it, in `message` and everything
// nested in it.
absl::Status CheckWireTypes(const google::protobuf::Message& message) {
  const google::protobuf::Reflection& reflection = *message.GetReflection();
  const google::protobuf::Descriptor& type = *message.GetDescriptor();
  const google::protobuf::UnknownFieldSet& unknown = reflection.GetUnknownFields(message);
  for (int i = 0; i < unknown.field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field =
        type.FindFieldByNumber(unknown.field(i).number());
    if (field != nullptr) {
      return Invalid(type, fmt::format("field {} ({}) has the wrong wire type", field->number(),
                                       field->name()));
    }
  }
  for (int i = 0; i < type.field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = type.field(i);
    if (field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (field->is_repeated()) {
      for (int j = 0; j < reflection.FieldSize(message, field); ++j) {
        absl::Status status = CheckWireTypes(reflection.GetRepeatedMessage(message, field, j));
        if (!status.ok()) return status;
      }
    } else if (reflection.HasField(message, field)) {
      absl::Status status = CheckWireTypes(reflection.GetMessage(message, field));
      if (!status.ok()) return status;
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view ProtocolErrorName(ProtocolError error) {
  switch (error) {
    case ProtocolError::kFrameTooLarge:
      return "FRAME_TOO_LARGE";
    case ProtocolError::kInvalidFrame:
      return "INVALID_FRAME";
  }
  return "INVALID_FRAME";
}

std::optional<ProtocolError> ProtocolErrorOf(const absl::Status& status) {
  auto payload = status.GetPayload(ToAbsl(kErrorPayloadUrl));
  if (!payload) return std::nullopt;
  if (*payload == ToAbsl(ProtocolErrorName(ProtocolError::kFrameTooLarge))) {
    return ProtocolError::kFrameTooLarge;
  }
  return ProtocolError::kInvalidFrame;
}

std::size_t MessageBound(const google::protobuf::Descriptor& type) {
  auto it = Bounds().find(type.full_name());
  return it == Bounds().end() ? kDefaultMessageBound : it->second;
}

absl::StatusOr<std::string> EncodeMessage(const google::protobuf::Message& message) {
  const google::protobuf::Descriptor& type = *message.GetDescriptor();
  std::size_t size = message.ByteSizeLong();
  if (size > MessageBound(type)) return TooLarge(type, size);
  std::string out;
  if (!message.SerializeToString(&out)) {
    return WithError(absl::InvalidArgumentError(
                         fmt::format("INVALID_FRAME: {} could not be encoded", type.full_name())),
                     ProtocolError::kInvalidFrame);
  }
  return out;
}

absl::Status DecodeMessage(std::string_view bytes, google::protobuf::Message* out) {
  const google::protobuf::Descriptor& type = *out->GetDescriptor();
  if (bytes.size() > MessageBound(type)) return TooLarge(type, bytes.size());
  out->Clear();
  google::protobuf::io::CodedInputStream input(reinterpret_cast<const uint8_t*>(bytes.data()),
                                               static_cast<int>(bytes.size()));
  input.SetRecursionLimit(kMaxNestingDepth);
  if (!out->MergePartialFromCodedStream(&input) || !input.ConsumedEntireMessage()) {
    out->Clear();
    return WithError(absl::InvalidArgumentError(fmt::format(
                         "INVALID_FRAME: {} bytes are not a valid {} (truncated, malformed, "
                         "invalid UTF-8 or nested deeper than {})",
                         bytes.size(), type.full_name(), kMaxNestingDepth)),
                     ProtocolError::kInvalidFrame);
  }
  if (absl::Status status = CheckWireTypes(*out); !status.ok()) {
    out->Clear();
    return status;
  }
  return absl::OkStatus();
}

}  // namespace bcd::proto
