#pragma once

// A mode (node, site, ramdisk) as the engine sees it. The engine (daemon/agent.h) knows no mode:
// it asks the mode for its role and capabilities, then hands it a ModeContext in which the mode
// registers its command handlers and spec sections and starts its servers. The modes live in
// modes/; app/modes.cc is the one list that picks one by name.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/metrics.h"
#include "bettercompute/common/v1/common.pb.h"
#include "config/config.h"
#include "proto/kinds.h"

namespace bcd {

class Dispatcher;
class DesiredState;
class SecretClient;
class SessionEngine;

// What the engine lends a mode while it wires itself in; every pointer outlives the mode's
// Detach().
struct ModeContext {
  const Config* config = nullptr;
  std::string node_id;
  std::string site;  // the site of the node's SPIFFE id
  // Signs a signing input (proto/signing_input.h) with the current node key, naming it by the
  // node's SPIFFE id and carrying its chain (a renewal changes both): the site agent's discovery
  // assertions.
  std::function<absl::StatusOr<bettercompute::common::v1::Signature>(
      std::string_view signing_input)>
      sign;
  std::filesystem::path state_dir;
  bool websocket = false;  // a WebSocket session: signed intent only, no tunnels
  Dispatcher* dispatcher = nullptr;
  DesiredState* desired = nullptr;
  SecretClient* secrets = nullptr;
  SessionEngine* engine = nullptr;  // sends frames and events, waits for the outbox
  UnixClock now;
  Logger* log = nullptr;
  Metrics* metrics = nullptr;  // where the mode adds its figures (the metadata service's)
};

class Mode {
 public:
  virtual ~Mode() = default;
  // Which one it is: its name (proto::ModeName) and the kinds the table gives it.
  virtual proto::Mode id() const = 0;
  // The role Hello and join send.
  virtual bettercompute::common::v1::Role role() const = 0;
  // What Hello advertises beyond the engine's own (tunnel ops, secrets, the daemon and access
  // sections): e.g. instance dial and workload tokens in node mode.
  virtual std::vector<std::string> Capabilities(bool websocket) const = 0;
  // The config tables this mode reads beyond the engine's own (EngineConfigSections): node mode's
  // [imds], say. A table neither reads is reported at start (a site agent given a node's [imds]).
  virtual std::vector<std::string> ConfigSections() const = 0;
  // Registers the mode's handlers and spec sections and starts its servers, once, before the
  // session runs. An error stops the daemon before it dials.
  virtual absl::Status Attach(const ModeContext& context) = 0;
  // Stops what Attach started (servers, threads) before the engine's parts go away. Idempotent.
  virtual void Detach() = 0;
  // Tunnels to instances of this machine (node mode's VPS instances): the address an instance id
  // reaches, nullopt when it names none. Modes without instances keep the default.
  virtual bool instance_dial() const { return false; }
  virtual std::optional<std::string> InstanceAddress(const std::string& instance_id) const {
    (void)instance_id;
    return std::nullopt;
  }
};

// The engine's capabilities on either transport: tunnel ops over gRPC (none over the WebSocket,
// which refuses tunnels), secrets, and the sections it applies itself (daemon, access).
std::vector<std::string> EngineCapabilities(bool websocket);

// What Hello advertises for `mode`: the engine's capabilities and the mode's, in one list.
std::vector<std::string> AllCapabilities(const Mode& mode, bool websocket);

// The config tables the engine reads whatever the mode: websocket, update, tunnels, diag.
std::vector<std::string> EngineConfigSections();
// The tables of `config` that neither the engine nor `mode` reads, in file order.
std::vector<std::string> UnreadConfigSections(const Config& config, const Mode& mode);

}  // namespace bcd
