#include "proto/frame_codec.h"

#include <functional>

#include "bettercompute/agent/v1/session.pb.h"
#include "bettercompute/agent/v1/tunnel.pb.h"
#include "gtest/gtest.h"
#include "proto/absl_compat.h"

namespace bcd::proto {
namespace {

namespace v1 = bettercompute::agent::v1;

std::string Message(const absl::Status& status) { return std::string(ToStd(status.message())); }

// Grows one bytes/string field until the message's encoding is exactly `size` bytes.
void FillToSize(google::protobuf::Message* message, std::size_t size,
                const std::function<void(std::size_t)>& set_payload) {
  std::size_t n = size;
  for (int i = 0; i < 8; ++i) {
    set_payload(n);
    std::size_t got = message->ByteSizeLong();
    if (got == size) return;
    n = n + size - got;
  }
  FAIL() << "could not reach exactly " << size << " bytes";
}

struct BoundCase {
  std::string name;
  std::function<std::unique_ptr<google::protobuf::Message>(std::size_t)> make;  // exactly n bytes
  std::size_t bound;
};

std::vector<BoundCase> BoundCases() {
  return {
      {"AgentFrame",
       [](std::size_t n) {
         auto frame = std::make_unique<v1::AgentFrame>();
         FillToSize(frame.get(), n, [&](std::size_t k) {
           frame->mutable_event()->set_message(std::string(k, 'a'));
         });
         return frame;
       },
       4u << 20},
      {"ServerFrame",
       [](std::size_t n) {
         auto frame = std::make_unique<v1::ServerFrame>();
         FillToSize(frame.get(), n, [&](std::size_t k) {
           frame->mutable_command()->set_body(std::string(k, 'b'));
         });
         return frame;
       },
       4u << 20},
      {"TunnelFrame",
       [](std::size_t n) {
         auto frame = std::make_unique<v1::TunnelFrame>();
         FillToSize(frame.get(), n,
                    [&](std::size_t k) { frame->mutable_data()->set_data(std::string(k, 'c')); });
         return frame;
       },
       1u << 20},
      {"RenewRequest",
       [](std::size_t n) {
         auto request = std::make_unique<v1::RenewRequest>();
         FillToSize(request.get(), n,
                    [&](std::size_t k) { request->set_csr(std::string(k, 'd')); });
         return request;
       },
       64u << 10},
      {"JoinRequest",
       [](std::size_t n) {
         auto request = std::make_unique<v1::JoinRequest>();
         FillToSize(request.get(), n,
                    [&](std::size_t k) { request->set_evidence(std::string(k, 'e')); });
         return request;
       },
       256u << 10},
  };
}

TEST(FrameCodec, EncodesAndDecodesExactlyAtTheBound) {
  for (const BoundCase& c : BoundCases()) {
    SCOPED_TRACE(c.name);
    auto message = c.make(c.bound);
    ASSERT_EQ(message->ByteSizeLong(), c.bound);
    EXPECT_EQ(MessageBound(*message->GetDescriptor()), c.bound);
    absl::StatusOr<std::string> bytes = EncodeMessage(*message);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    std::unique_ptr<google::protobuf::Message> decoded(message->New());
    ASSERT_TRUE(DecodeMessage(*bytes, decoded.get()).ok());
    EXPECT_EQ(decoded->SerializeAsString(), *bytes);
  }
}

TEST(FrameCodec, RefusesToEncodeOneByteOverTheBound) {
  for (const BoundCase& c : BoundCases()) {
    SCOPED_TRACE(c.name);
    auto message = c.make(c.bound + 1);
    absl::StatusOr<std::string> bytes = EncodeMessage(*message);
    ASSERT_FALSE(bytes.ok());
    EXPECT_EQ(ProtocolErrorOf(bytes.status()), ProtocolError::kFrameTooLarge);
    EXPECT_EQ(bytes.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(Message(bytes.status()), "FRAME_TOO_LARGE: " + message->GetDescriptor()->full_name() +
                                           " of " + std::to_string(c.bound + 1) +
                                           " bytes is over its bound of " +
                                           std::to_string(c.bound) + " bytes");
  }
}

TEST(FrameCodec, RefusesToDecodeOneByteOverTheBoundBeforeParsing) {
  for (const BoundCase& c : BoundCases()) {
    SCOPED_TRACE(c.name);
    // Garbage that would be INVALID_FRAME if it were parsed: the size check comes first.
    std::string bytes(c.bound + 1, '\xff');
    std::unique_ptr<google::protobuf::Message> out(c.make(c.bound)->New());
    absl::Status status = DecodeMessage(bytes, out.get());
    EXPECT_EQ(ProtocolErrorOf(status), ProtocolError::kFrameTooLarge) << status;
  }
}

TEST(FrameCodec, UnboundedTypesGetTheDefaultBound) {
  EXPECT_EQ(MessageBound(*v1::Ack::descriptor()), kDefaultMessageBound);
  EXPECT_EQ(MessageBound(*v1::GatewayProof::descriptor()), 1024u);
}

void ExpectInvalid(std::string_view bytes, std::string_view expected_message) {
  v1::AgentFrame frame;
  frame.mutable_hello()->set_daemon_version("left over");
  absl::Status status = DecodeMessage(bytes, &frame);
  EXPECT_EQ(ProtocolErrorOf(status), ProtocolError::kInvalidFrame) << status;
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Message(status), expected_message);
  EXPECT_EQ(frame.ByteSizeLong(), 0u) << "a failed decode leaves nothing behind";
}

std::string ValidHelloFrame() {
  v1::AgentFrame frame;
  frame.mutable_hello()->set_proto_min(1);
  frame.mutable_hello()->set_proto_max(1);
  frame.mutable_hello()->set_daemon_version("0.1.0");
  frame.mutable_hello()->add_capabilities("tunnel.shell");
  return frame.SerializeAsString();
}

TEST(FrameCodec, RefusesTruncatedFrames) {
  std::string bytes = ValidHelloFrame();
  for (std::size_t cut = 1; cut < bytes.size(); ++cut) {
    v1::AgentFrame frame;
    absl::Status status = DecodeMessage(std::string_view(bytes).substr(0, cut), &frame);
    EXPECT_EQ(ProtocolErrorOf(status), ProtocolError::kInvalidFrame) << "cut at " << cut;
  }
  ExpectInvalid(bytes.substr(0, 5),
                "INVALID_FRAME: 5 bytes are not a valid bettercompute.agent.v1.AgentFrame "
                "(truncated, malformed, invalid UTF-8 or nested deeper than 32)");
}

TEST(FrameCodec, RefusesGarbage) {
  ExpectInvalid(std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11),
                "INVALID_FRAME: 11 bytes are not a valid bettercompute.agent.v1.AgentFrame "
                "(truncated, malformed, invalid UTF-8 or nested deeper than 32)");
  // Field number 0 is never valid.
  ExpectInvalid(std::string("\x00\x01", 2),
                "INVALID_FRAME: 2 bytes are not a valid bettercompute.agent.v1.AgentFrame "
                "(truncated, malformed, invalid UTF-8 or nested deeper than 32)");
}

TEST(FrameCodec, RefusesAKnownFieldWithTheWrongWireType) {
  // AgentFrame.hello (field 1, a message) sent as a varint.
  ExpectInvalid(std::string("\x08\x01", 2),
                "INVALID_FRAME: bettercompute.agent.v1.AgentFrame: field 1 (hello) has the wrong "
                "wire type");
  // Hello.proto_min (field 1, a varint) sent as length-delimited, nested inside the frame.
  ExpectInvalid(std::string("\x0a\x03\x0a\x01"
                            "A",
                            5),
                "INVALID_FRAME: bettercompute.agent.v1.Hello: field 1 (proto_min) has the wrong "
                "wire type");
}

TEST(FrameCodec, RefusesInvalidUtf8InAString) {
  // Hello.daemon_version (field 3) = "\xc3\x28".
  ExpectInvalid(std::string("\x0a\x04\x1a\x02\xc3\x28", 6),
                "INVALID_FRAME: 6 bytes are not a valid bettercompute.agent.v1.AgentFrame "
                "(truncated, malformed, invalid UTF-8 or nested deeper than 32)");
}

TEST(FrameCodec, RefusesDeepNestingWithoutCrashing) {
  // 10,000 nested start-groups of unknown field 15, closed properly.
  std::string bytes;
  for (int i = 0; i < 10000; ++i) bytes += '\x7b';  // field 15, wire type 3 (start group)
  for (int i = 0; i < 10000; ++i) bytes += '\x7c';  // field 15, wire type 4 (end group)
  ExpectInvalid(bytes,
                "INVALID_FRAME: 20000 bytes are not a valid bettercompute.agent.v1.AgentFrame "
                "(truncated, malformed, invalid UTF-8 or nested deeper than 32)");
}

TEST(FrameCodec, AcceptsNestingUpToTheLimit) {
  std::string bytes;
  for (int i = 0; i < kMaxNestingDepth - 1; ++i) bytes += '\x7b';
  for (int i = 0; i < kMaxNestingDepth - 1; ++i) bytes += '\x7c';
  v1::AgentFrame frame;
  EXPECT_TRUE(DecodeMessage(bytes, &frame).ok());
}

TEST(FrameCodec, KeepsAnUnknownFrameCaseThroughDecodeAndReencode) {
  // A newer gateway's ServerFrame case 50 carrying a message with a string field.
  std::string future_case = std::string("\x92\x03\x05\x0a\x03new", 8);
  v1::ServerFrame frame;
  ASSERT_TRUE(DecodeMessage(future_case, &frame).ok());
  EXPECT_EQ(frame.frame_case(), v1::ServerFrame::FRAME_NOT_SET);
  absl::StatusOr<std::string> again = EncodeMessage(frame);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, future_case);
}

TEST(FrameCodec, KeepsUnknownFieldsOfKnownMessages) {
  // A newer daemon's Hello with an extra field 30 (varint 7) and field 31 (bytes "xyz").
  std::string hello = ValidHelloFrame().substr(2);  // the Hello body without the frame's tag+len
  std::string newer_hello = hello + std::string("\xf0\x01\x07\xfa\x01\x03xyz", 9);
  std::string frame_bytes =
      std::string("\x0a") + static_cast<char>(newer_hello.size()) + newer_hello;
  v1::AgentFrame frame;
  ASSERT_TRUE(DecodeMessage(frame_bytes, &frame).ok());
  ASSERT_EQ(frame.frame_case(), v1::AgentFrame::kHello);
  EXPECT_EQ(frame.hello().daemon_version(), "0.1.0");
  const auto& unknown = frame.hello().GetReflection()->GetUnknownFields(frame.hello());
  ASSERT_EQ(unknown.field_count(), 2);
  EXPECT_EQ(unknown.field(0).number(), 30);
  EXPECT_EQ(unknown.field(0).varint(), 7u);
  EXPECT_EQ(unknown.field(1).length_delimited(), "xyz");
  absl::StatusOr<std::string> again = EncodeMessage(frame);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, frame_bytes);
}

TEST(FrameCodec, ErrorsOfOtherModulesCarryNoProtocolError) {
  EXPECT_EQ(ProtocolErrorOf(absl::InvalidArgumentError("x")), std::nullopt);
  EXPECT_EQ(ProtocolErrorName(ProtocolError::kFrameTooLarge), "FRAME_TOO_LARGE");
  EXPECT_EQ(ProtocolErrorName(ProtocolError::kInvalidFrame), "INVALID_FRAME");
}

TEST(FrameCodec, DecodeTemplateReturnsTheMessage) {
  absl::StatusOr<v1::AgentFrame> frame = Decode<v1::AgentFrame>(ValidHelloFrame());
  ASSERT_TRUE(frame.ok());
  EXPECT_EQ(frame->hello().capabilities(0), "tunnel.shell");
}

}  // namespace
}  // namespace bcd::proto
