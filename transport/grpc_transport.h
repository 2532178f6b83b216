#pragma once

// agent/v1 over gRPC with mutual TLS 1.3, pinned to the serving CA (tls.h).

#include <functional>
#include <memory>

#include "transport/tls.h"
#include "transport/transport.h"

namespace bcd::transport {

class GrpcTransport final : public Transport {
 public:
  // `spec` without identity; `identity` is called at every dial for the current key and chain.
  GrpcTransport(ChannelSpec spec, std::function<absl::StatusOr<ClientIdentity>()> identity);
  absl::StatusOr<std::unique_ptr<FrameStream>> OpenSession() override;

 private:
  ChannelSpec spec_;
  std::function<absl::StatusOr<ClientIdentity>()> identity_;
};

}  // namespace bcd::transport
