#include "transport/grpc_transport.h"

#include "bettercompute/agent/v1/session.grpc.pb.h"
#include "grpcpp/client_context.h"

namespace bcd::transport {
namespace {

namespace v1 = bettercompute::agent::v1;

// One bidirectional call on a channel (Session or Tunnel): reads on one thread, writes from any
// (serialized), Cancel from any.
template <class Out, class In>
class GrpcCall {
 public:
  using Stream = grpc::ClientReaderWriter<Out, In>;
  GrpcCall(std::shared_ptr<grpc::Channel> channel,
           std::unique_ptr<Stream> (v1::AgentGateway::Stub::*start)(grpc::ClientContext*))
      : channel_(std::move(channel)), stub_(v1::AgentGateway::NewStub(channel_)) {
    stream_ = (stub_.get()->*start)(&context_);
  }
  bool Read(In* message) { return stream_->Read(message); }
  bool Write(const Out& message) {
    std::lock_guard<std::mutex> lock(write_mu_);
    return stream_->Write(message);
  }
  void CloseSend() {
    std::lock_guard<std::mutex> lock(write_mu_);
    stream_->WritesDone();
  }
  void Cancel() { context_.TryCancel(); }
  grpc::Status Finish() { return stream_->Finish(); }
  const grpc::ClientContext& context() const { return context_; }
  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }

 private:
  std::shared_ptr<grpc::Channel> channel_;  // kept alive while the call is
  std::unique_ptr<v1::AgentGateway::Stub> stub_;
  grpc::ClientContext context_;
  std::mutex write_mu_;
  std::unique_ptr<Stream> stream_;
};

class GrpcTunnelStream final : public TunnelStream {
 public:
  // On the session's connection.
  explicit GrpcTunnelStream(std::shared_ptr<grpc::Channel> channel)
      : call_(std::move(channel), &v1::AgentGateway::Stub::Tunnel) {}
  bool Read(v1::TunnelFrame* frame) override { return call_.Read(frame); }
  bool Write(const v1::TunnelFrame& frame) override { return call_.Write(frame); }
  void CloseSend() override { call_.CloseSend(); }
  void Cancel() override { call_.Cancel(); }
  Refusal Finish() override { return RefusalOf(call_.Finish(), call_.context()); }

 private:
  GrpcCall<v1::TunnelFrame, v1::TunnelFrame> call_;
};

class GrpcFrameStream final : public FrameStream {
 public:
  GrpcFrameStream(std::shared_ptr<grpc::Channel> channel, std::shared_ptr<VerificationLog> log)
      : call_(std::move(channel), &v1::AgentGateway::Stub::Session), log_(std::move(log)) {}

  bool Read(v1::ServerFrame* frame) override { return call_.Read(frame); }
  bool Write(const v1::AgentFrame& frame) override { return call_.Write(frame); }
  void CloseSend() override { call_.CloseSend(); }
  void Cancel() override { call_.Cancel(); }
  absl::StatusOr<std::unique_ptr<TunnelStream>> OpenTunnel() override {
    return std::unique_ptr<TunnelStream>(new GrpcTunnelStream(call_.channel()));
  }
  Refusal Finish() override {
    grpc::Status status = call_.Finish();
    Refusal refusal = RefusalOf(status, call_.context());
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE && log_ && !log_->Last().empty()) {
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

absl::StatusOr<std::unique_ptr<FrameStream>> GrpcTransport::OpenSession() {
  absl::StatusOr<ClientIdentity> identity = identity_();
  if (!identity.ok()) return identity.status();
  ChannelSpec spec = spec_;
  spec.identity = *identity;
  if (!spec.log) spec.log = std::make_shared<VerificationLog>();
  spec.log->Record("");
  return std::unique_ptr<FrameStream>(new GrpcFrameStream(MakeChannel(spec), spec.log));
}

}  // namespace bcd::transport
