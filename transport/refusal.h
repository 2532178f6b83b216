#pragma once

// A gRPC error as the protocol means it: the status, the x-bc-reason token and the server's
// requested delay (grpc-retry-pushback-ms or retry-after), if any.

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"

namespace bcd::transport {

// A delay a server asks for is taken within these bounds: 0 would make a redial loop hot, and a
// huge one would make bcd never come back.
inline constexpr std::chrono::milliseconds kMinPushback = std::chrono::seconds(1);
inline constexpr std::chrono::milliseconds kMaxPushback = std::chrono::hours(1);

// The delay a grpc-retry-pushback-ms (milliseconds) or retry-after (seconds, as a number) value
// asks for, converted without overflow and clamped to [kMinPushback, kMaxPushback]; nullopt when
// it is not a non-negative decimal number.
std::optional<std::chrono::milliseconds> ParsePushback(std::string_view value, bool seconds);

struct Refusal {
  grpc::StatusCode code = grpc::StatusCode::OK;
  std::string reason;   // x-bc-reason; empty when the server gave none
  std::string message;  // grpc-message
  std::optional<std::chrono::milliseconds> pushback;  // within [kMinPushback, kMaxPushback]

  // Reasons a redial cannot fix: a person must act (revoked, unknown-node, trust-domain-mismatch).
  bool NeedsPerson() const;
  std::string ToString() const;  // "refused (invalid-token): unknown join token"
};

// A refusal over HTTP (the WebSocket upgrade, POST /v1/renew): grpc-status when the server sent
// one, else the HTTP status mapped as gRPC maps it (401 UNAUTHENTICATED, 403 PERMISSION_DENIED,
// 429/502/503/504 UNAVAILABLE, ...); x-bc-reason; pushback from grpc-retry-pushback-ms or
// retry-after. `headers` have lower-case names.
Refusal RefusalOfHttp(unsigned status, const std::map<std::string, std::string>& headers,
                      std::string message);

// Reads the refusal from a finished call's status and trailing metadata.
Refusal RefusalOf(const grpc::Status& status, const grpc::ClientContext& context);

}  // namespace bcd::transport
