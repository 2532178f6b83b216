#pragma once

// agent/v1 over gRPC with mutual TLS 1.3, pinned to the serving CA (tls.h).

#include <functional>
#include <memory>

#include "transport/tls.h"
#include "transport/transport.h"

namespace bcd::transport {

class GrpcTransport final : public Transport {
 public:
  // `spec` without identity; `identity` is called at every dial (and renewal) for the current key
  // and chain. A transport for Join alone has none (nullptr).
  GrpcTransport(ChannelSpec spec, std::function<absl::StatusOr<ClientIdentity>()> identity);
  absl::StatusOr<std::unique_ptr<FrameStream>> OpenSession() override;
  absl::StatusOr<bettercompute::agent::v1::JoinResponse> Join(
      const bettercompute::agent::v1::JoinRequest& request, Refusal* refusal) override;
  // Over mutual TLS with the current identity.
  absl::StatusOr<bettercompute::agent::v1::RenewResponse> Renew(
      const bettercompute::agent::v1::RenewRequest& request, Refusal* refusal) override;

 private:
  // The spec with the current identity (an error when there is none) and a fresh verification log.
  absl::StatusOr<ChannelSpec> WithIdentity() const;

  ChannelSpec spec_;
  std::function<absl::StatusOr<ClientIdentity>()> identity_;
};

}  // namespace bcd::transport
