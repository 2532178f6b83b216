#pragma once

// The seam between the session engine and whatever carries frames (gRPC today, WebSocket later).
// The engine never knows which transport it holds.

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

class Transport {
 public:
  virtual ~Transport() = default;
  // Opens a Session stream with the node's current identity (re-read at every dial, so a renewal
  // applies to the next one). An error here means the dial failed before the stream opened.
  virtual absl::StatusOr<std::unique_ptr<FrameStream>> OpenSession() = 0;
};

}  // namespace bcd::transport
