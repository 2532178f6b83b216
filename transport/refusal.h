#pragma once

// A gRPC error as the protocol means it: the status, the x-bc-reason token and the server's
// requested delay (grpc-retry-pushback-ms or retry-after), if any.

#include <chrono>
#include <optional>
#include <string>

#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"

namespace bcd::transport {

struct Refusal {
  grpc::StatusCode code = grpc::StatusCode::OK;
  std::string reason;   // x-bc-reason; empty when the server gave none
  std::string message;  // grpc-message
  std::optional<std::chrono::milliseconds> pushback;

  // Reasons a redial cannot fix: a person must act (revoked, unknown-node, trust-domain-mismatch).
  bool NeedsPerson() const;
  std::string ToString() const;  // "refused (invalid-token): unknown join token"
};

// Reads the refusal from a finished call's status and trailing metadata.
Refusal RefusalOf(const grpc::Status& status, const grpc::ClientContext& context);

}  // namespace bcd::transport
