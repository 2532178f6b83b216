#pragma once

// Bounded encode and decode of every agent/v1 message.
//
// Every byte string that arrives from outside (a gRPC message, a WebSocket message, the body of a
// signed envelope) is decoded through here: the size bound of its message type is checked before a
// byte is parsed, nesting is capped, and a failure is one of two distinct protocol errors. Decoding
// keeps unknown fields, so a message from a newer peer re-encodes without losing anything.
//
// All functions are pure and thread-safe.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/message.h"

namespace bcd::proto {

enum class ProtocolError {
  kFrameTooLarge,  // FRAME_TOO_LARGE: more bytes than the message type's bound.
  kInvalidFrame,   // INVALID_FRAME: the bytes are not a valid encoding of the message type.
};

// The token the protocol uses for an error ("FRAME_TOO_LARGE", "INVALID_FRAME").
std::string_view ProtocolErrorName(ProtocolError error);

// The protocol error a status from this module carries, or nullopt for any other status.
std::optional<ProtocolError> ProtocolErrorOf(const absl::Status& status);

// Nesting deeper than this (known messages and unknown groups alike) is INVALID_FRAME.
inline constexpr int kMaxNestingDepth = 32;

// The most bytes an encoding of a message of this type may have. Types without their own bound get
// kDefaultMessageBound.
inline constexpr std::size_t kDefaultMessageBound = std::size_t{1} << 20;
std::size_t MessageBound(const google::protobuf::Descriptor& type);

// Encodes `message`; FRAME_TOO_LARGE when the encoding would exceed the type's bound.
absl::StatusOr<std::string> EncodeMessage(const google::protobuf::Message& message);

// Replaces `*out` with the decoding of `bytes`. FRAME_TOO_LARGE when `bytes` exceeds the bound of
// out's type (checked before parsing), INVALID_FRAME when the bytes do not decode: truncated,
// malformed, invalid UTF-8 in a string, nested deeper than kMaxNestingDepth, or a known field with
// the wrong wire type (which protobuf alone would keep as an unknown field). On error *out is
// empty.
absl::Status DecodeMessage(std::string_view bytes, google::protobuf::Message* out);

template <typename T>
absl::StatusOr<T> Decode(std::string_view bytes) {
  T message;
  if (absl::Status status = DecodeMessage(bytes, &message); !status.ok()) return status;
  return message;
}

}  // namespace bcd::proto
