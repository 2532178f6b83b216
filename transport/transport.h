#pragma once

// The seam between the engine and whatever carries its calls to the gateway (gRPC, or the
// WebSocket where a proxy strips client certificates). The engine never knows which it holds.

#include <memory>

#include "absl/status/statusor.h"
#include "bettercompute/agent/v1/session.pb.h"
#include "bettercompute/agent/v1/tunnel.pb.h"
#include "transport/refusal.h"

namespace bcd::transport {

// One Tunnel stream (gRPC only): TunnelFrames both ways, on the session's connection. Read and
// Write from two threads; Cancel from any.
class TunnelStream {
 public:
  virtual ~TunnelStream() = default;
  virtual bool Read(bettercompute::agent::v1::TunnelFrame* frame) = 0;
  virtual bool Write(const bettercompute::agent::v1::TunnelFrame& frame) = 0;
  virtual void CloseSend() = 0;
  virtual void Cancel() = 0;
  virtual Refusal Finish() = 0;
};

// One open session stream. Read and Write may be called from two different threads (one reader,
// one writer); Cancel from any thread, and it makes a blocked Read return false.
class FrameStream {
 public:
  virtual ~FrameStream() = default;
  // False when the stream ended (then call Finish).
  virtual bool Read(bettercompute::agent::v1::ServerFrame* frame) = 0;
  virtual bool Write(const bettercompute::agent::v1::AgentFrame& frame) = 0;
  // Half-closes the sending side: the gateway sees a clean end.
  virtual void CloseSend() = 0;
  virtual void Cancel() = 0;
  // Why the stream ended; call after Read returned false. Code OK means a clean end.
  virtual Refusal Finish() = 0;
  // A Tunnel stream on the same connection, for an OpenTunnel this session received.
  // Unimplemented on a transport without tunnels (the WebSocket).
  virtual absl::StatusOr<std::unique_ptr<TunnelStream>> OpenTunnel() {
    return absl::UnimplementedError("tunnels need the gRPC transport");
  }
};

// Everything bcd says to the gateway goes through one of these: the Session stream and the two
// unary calls, on the transport's own connection settings (target, pin, proxy, keepalive).
class Transport {
 public:
  virtual ~Transport() = default;
  // Opens a Session stream with the node's current identity (re-read at every dial, so a renewal
  // applies to the next one). An error here means the dial failed before the stream opened.
  virtual absl::StatusOr<std::unique_ptr<FrameStream>> OpenSession() = 0;
  // Join over server-authenticated TLS (no identity yet). Unavailable when the gateway could not
  // be reached or failed verification (the message says which); PermissionDenied when it refused
  // (the message and `refusal` name its reason).
  virtual absl::StatusOr<bettercompute::agent::v1::JoinResponse> Join(
      const bettercompute::agent::v1::JoinRequest& request, Refusal* refusal) = 0;
  // Renew, the request carrying the current chain and its proof of possession. An error when no
  // answer came or the gateway refused; then `refusal` (when given) holds its reason and pushback.
  virtual absl::StatusOr<bettercompute::agent::v1::RenewResponse> Renew(
      const bettercompute::agent::v1::RenewRequest& request, Refusal* refusal) = 0;
};

}  // namespace bcd::transport
