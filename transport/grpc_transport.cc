#include "transport/grpc_transport.h"

#include "bettercompute/agent/v1/session.grpc.pb.h"
#include "grpcpp/client_context.h"

namespace bcd::transport {
namespace {

namespace v1 = bettercompute::agent::v1;

class GrpcTunnelStream final : public TunnelStream {
 public:
  GrpcTunnelStream(std::shared_ptr<grpc::Channel> channel)
      : channel_(std::move(channel)), stub_(v1::AgentGateway::NewStub(channel_)) {
    stream_ = stub_->Tunnel(&context_);
  }
  bool Read(v1::TunnelFrame* frame) override { return stream_->Read(frame); }
  bool Write(const v1::TunnelFrame& frame) override {
    std::lock_guard<std::mutex> lock(write_mu_);
    return stream_->Write(frame);
  }
  void CloseSend() override {
    std::lock_guard<std::mutex> lock(write_mu_);
    stream_->WritesDone();
  }
  void Cancel() override { context_.TryCancel(); }
  Refusal Finish() override { return RefusalOf(stream_->Finish(), context_); }

 private:
  std::shared_ptr<grpc::Channel> channel_;  // the session's connection
  std::unique_ptr<v1::AgentGateway::Stub> stub_;
  grpc::ClientContext context_;
  std::mutex write_mu_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::TunnelFrame, v1::TunnelFrame>> stream_;
};

class GrpcFrameStream final : public FrameStream {
 public:
  GrpcFrameStream(std::shared_ptr<grpc::Channel> channel, std::shared_ptr<VerificationLog> log)
      : channel_(std::move(channel)),
        stub_(v1::AgentGateway::NewStub(channel_)),
        log_(std::move(log)) {
    stream_ = stub_->Session(&context_);
  }

  bool Read(v1::ServerFrame* frame) override { return stream_->Read(frame); }
  bool Write(const v1::AgentFrame& frame) override {
    std::lock_guard<std::mutex> lock(write_mu_);
    return stream_->Write(frame);
  }
  void CloseSend() override {
    std::lock_guard<std::mutex> lock(write_mu_);
    stream_->WritesDone();
  }
  void Cancel() override { context_.TryCancel(); }
  absl::StatusOr<std::unique_ptr<TunnelStream>> OpenTunnel() override {
    return std::unique_ptr<TunnelStream>(new GrpcTunnelStream(channel_));
  }
  Refusal Finish() override {
    grpc::Status status = stream_->Finish();
    Refusal refusal = RefusalOf(status, context_);
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE && log_ && !log_->Last().empty()) {
      refusal.message = log_->Last();
    }
    return refusal;
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::AgentGateway::Stub> stub_;
  std::shared_ptr<VerificationLog> log_;
  grpc::ClientContext context_;
  std::mutex write_mu_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::AgentFrame, v1::ServerFrame>> stream_;
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
