#include "transport/grpc_transport.h"

#include "base/mutex.h"
#include "bettercompute/agent/v1/session.grpc.pb.h"
#include "fmt/format.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "proto/absl_compat.h"
#include "proto/frame_codec.h"

namespace bcd::transport {
namespace {

namespace v1 = bettercompute::agent::v1;

constexpr char kSessionMethod[] = "/bettercompute.agent.v1.AgentGateway/Session";
constexpr char kTunnelMethod[] = "/bettercompute.agent.v1.AgentGateway/Tunnel";
// Join and Renew: a gateway that has not answered by then is treated as unreachable.
constexpr std::chrono::seconds kUnaryDeadline{30};

// One bidirectional call on a channel (Session or Tunnel): reads on one thread, writes from any
// (serialized), Cancel from any. Messages are read as bytes and decoded here, through the bounded
// codec: a message that does not decode cancels the call and is reported by Finish as a
// protocol error. (Left to gRPC, a message that does not parse makes Read return false while the
// call stays open, and Finish then waits for a status the gateway has no reason to send.)
template <class Out, class In>
class GrpcCall {
 public:
  GrpcCall(std::shared_ptr<grpc::Channel> channel, const char* method)
      : channel_(std::move(channel)),
        stream_(grpc::internal::ClientReaderWriterFactory<Out, grpc::ByteBuffer>::Create(
            channel_.get(),
            grpc::internal::RpcMethod(method, grpc::internal::RpcMethod::BIDI_STREAMING),
            &context_)) {}
  bool Read(In* message) {
    grpc::ByteBuffer buffer;
    if (!stream_->Read(&buffer)) return false;
    std::vector<grpc::Slice> slices;
    std::string bytes;
    if (buffer.Dump(&slices).ok()) {
      for (const grpc::Slice& slice : slices)
        bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
    if (absl::Status s = proto::DecodeMessage(bytes, message); !s.ok()) {
      {
        MutexLock lock(error_mu_);
        protocol_error_ = fmt::format("a {} from the gateway did not decode: {}",
                                      In::descriptor()->name(), ToStd(s.message()));
      }
      context_.TryCancel();
      return false;
    }
    return true;
  }
  bool Write(const Out& message) {
    MutexLock lock(write_mu_);
    return stream_->Write(message);
  }
  void CloseSend() {
    MutexLock lock(write_mu_);
    stream_->WritesDone();
  }
  void Cancel() { context_.TryCancel(); }
  Refusal Finish() {
    grpc::Status status = stream_->Finish();
    Refusal refusal = RefusalOf(status, context_);
    MutexLock lock(error_mu_);
    if (!protocol_error_.empty()) {
      refusal.code = grpc::StatusCode::INTERNAL;
      refusal.reason = "protocol-error";
      refusal.message = protocol_error_;
      refusal.pushback.reset();
    }
    return refusal;
  }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

 private:
  std::shared_ptr<grpc::Channel> channel_;  // kept alive while the call is
  grpc::ClientContext context_;
  Mutex write_mu_;
  std::unique_ptr<grpc::ClientReaderWriter<Out, grpc::ByteBuffer>> stream_;
  Mutex error_mu_;
  std::string protocol_error_ ABSL_GUARDED_BY(error_mu_);
};

class GrpcTunnelStream final : public TunnelStream {
 public:
  // On the session's connection.
  explicit GrpcTunnelStream(std::shared_ptr<grpc::Channel> channel)
      : call_(std::move(channel), kTunnelMethod) {}
  bool Read(v1::TunnelFrame* frame) override { return call_.Read(frame); }
  bool Write(const v1::TunnelFrame& frame) override { return call_.Write(frame); }
  void CloseSend() override { call_.CloseSend(); }
  void Cancel() override { call_.Cancel(); }
  Refusal Finish() override { return call_.Finish(); }

 private:
  GrpcCall<v1::TunnelFrame, v1::TunnelFrame> call_;
};

class GrpcFrameStream final : public FrameStream {
 public:
  GrpcFrameStream(std::shared_ptr<grpc::Channel> channel, std::shared_ptr<VerificationLog> log)
      : call_(std::move(channel), kSessionMethod), log_(std::move(log)) {}

  bool Read(v1::ServerFrame* frame) override { return call_.Read(frame); }
  bool Write(const v1::AgentFrame& frame) override { return call_.Write(frame); }
  void CloseSend() override { call_.CloseSend(); }
  void Cancel() override { call_.Cancel(); }
  absl::StatusOr<std::unique_ptr<TunnelStream>> OpenTunnel() override {
    return std::unique_ptr<TunnelStream>(new GrpcTunnelStream(call_.channel()));
  }
  Refusal Finish() override {
    Refusal refusal = call_.Finish();
    if (refusal.code == grpc::StatusCode::UNAVAILABLE && log_ && !log_->Last().empty()) {
      refusal.message = log_->Last();
    }
    return refusal;
  }

 private:
  GrpcCall<v1::AgentFrame, v1::ServerFrame> call_;
  std::shared_ptr<VerificationLog> log_;
};

}  // namespace

GrpcTransport::GrpcTransport(ChannelSpec spec,
                             std::function<absl::StatusOr<ClientIdentity>()> identity)
    : spec_(std::move(spec)), identity_(std::move(identity)) {}

absl::StatusOr<ChannelSpec> GrpcTransport::WithIdentity() const {
  if (!identity_) return absl::FailedPreconditionError("this node has not joined");
  absl::StatusOr<ClientIdentity> identity = identity_();
  if (!identity.ok()) return identity.status();
  ChannelSpec spec = spec_;
  spec.identity = *identity;
  if (!spec.log) spec.log = std::make_shared<VerificationLog>();
  spec.log->Record("");
  return spec;
}

absl::StatusOr<std::unique_ptr<FrameStream>> GrpcTransport::OpenSession() {
  absl::StatusOr<ChannelSpec> spec = WithIdentity();
  if (!spec.ok()) return spec.status();
  return std::unique_ptr<FrameStream>(new GrpcFrameStream(MakeChannel(*spec), spec->log));
}

absl::StatusOr<v1::JoinResponse> GrpcTransport::Join(const v1::JoinRequest& request,
                                                     Refusal* refusal) {
  ChannelSpec spec = spec_;
  spec.identity.reset();
  spec.log = std::make_shared<VerificationLog>();
  auto stub = v1::AgentGateway::NewStub(MakeChannel(spec));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kUnaryDeadline);
  v1::JoinResponse response;
  grpc::Status status = stub->Join(&context, request, &response);
  if (status.ok()) return response;
  Refusal why = RefusalOf(status, context);
  if (refusal != nullptr) *refusal = why;
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    std::string detail = spec.log->Last().empty() ? status.error_message() : spec.log->Last();
    return absl::UnavailableError(
        fmt::format("cannot reach the gateway at {}: {}", spec.target, detail));
  }
  return absl::PermissionDeniedError("join " + why.ToString());
}

absl::StatusOr<v1::RenewResponse> GrpcTransport::Renew(const v1::RenewRequest& request,
                                                       Refusal* refusal) {
  absl::StatusOr<ChannelSpec> spec = WithIdentity();
  if (!spec.ok()) return spec.status();
  auto stub = v1::AgentGateway::NewStub(MakeChannel(*spec));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kUnaryDeadline);
  v1::RenewResponse response;
  grpc::Status status = stub->Renew(&context, request, &response);
  if (status.ok()) return response;
  Refusal why = RefusalOf(status, context);
  if (refusal != nullptr) *refusal = why;
  return absl::UnavailableError("renew " + why.ToString());
}

}  // namespace bcd::transport
