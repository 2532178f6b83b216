#include "modes/site/bmc_kinds.h"

#include <sys/stat.h>

#include <algorithm>
#include <memory>
#include <optional>

#include "absl/strings/ascii.h"
#include "base/net.h"
#include "bettercompute/site/v1/site.pb.h"
#include "daemon/dispatch/dispatcher.h"
#include "daemon/secrets/secrets.h"
#include "fmt/format.h"
#include "modes/site/bmc.h"
#include "proto/absl_compat.h"

namespace bcd {
namespace {

namespace v1 = bettercompute::agent::v1;
namespace site = bettercompute::site::v1;
using Clock = std::chrono::steady_clock;

// A target's address: host, and the port when it names one.
struct Address {
  std::string host;
  std::optional<uint16_t> port;
};

std::optional<Address> ParseAddress(const std::string& text) {
  Address a;
  std::string port;
  if (!text.empty() && text[0] == '[') {
    std::size_t close = text.find(']');
    if (close == std::string::npos) return std::nullopt;
    a.host = text.substr(1, close - 1);
    if (!IsIpv6(a.host)) return std::nullopt;
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') return std::nullopt;
      port = text.substr(close + 2);
      if (port.empty()) return std::nullopt;
    }
  } else if (std::count(text.begin(), text.end(), ':') > 1) {
    a.host = text;  // a bare IPv6 address
    if (!IsIpv6(a.host)) return std::nullopt;
  } else {
    std::size_t colon = text.find(':');
    a.host = text.substr(0, colon);
    if (colon != std::string::npos) {
      port = text.substr(colon + 1);
      if (port.empty()) return std::nullopt;
    }
    if (!IsIpv4(a.host) && !IsDnsName(a.host)) return std::nullopt;
  }
  if (!port.empty()) {
    a.port = ParsePort(port);
    if (!a.port) return std::nullopt;
  }
  return a;
}

std::string_view ProtocolName(site::BmcProtocol protocol) {
  switch (protocol) {
    case site::BMC_PROTOCOL_REDFISH:
      return "redfish";
    case site::BMC_PROTOCOL_IPMI:
      return "ipmi";
    default:
      return "auto";
  }
}

absl::Status CheckTarget(const site::BmcTarget& target) {
  if (target.address().empty()) return absl::InvalidArgumentError("bmc.address is empty");
  std::optional<Address> address = ParseAddress(target.address());
  if (!address) {
    return absl::InvalidArgumentError(
        fmt::format("bmc.address \"{}\" is not a host name or IP address (with an optional :port)",
                    target.address().substr(0, 100)));
  }
  if (address->port && target.protocol() == site::BMC_PROTOCOL_AUTO) {
    return absl::InvalidArgumentError(
        fmt::format("bmc.address \"{}\" names a port: say which protocol it is for (bmc.protocol)",
                    target.address()));
  }
  if (target.protocol() != site::BMC_PROTOCOL_AUTO &&
      target.protocol() != site::BMC_PROTOCOL_REDFISH &&
      target.protocol() != site::BMC_PROTOCOL_IPMI) {
    return absl::InvalidArgumentError(fmt::format("bmc.protocol {} is not one this build knows",
                                                  static_cast<int>(target.protocol())));
  }
  if (target.credential_ref().empty())
    return absl::InvalidArgumentError("bmc.credential_ref is empty");
  if (!target.tls_spki_sha256().empty() && target.tls_spki_sha256().size() != 32) {
    return absl::InvalidArgumentError(
        fmt::format("bmc.tls_spki_sha256 has {} bytes, not 32", target.tls_spki_sha256().size()));
  }
  if (target.system_id().size() > 256 ||
      target.system_id().find_first_of("/?#%\r\n") != std::string::npos) {
    return absl::InvalidArgumentError("bmc.system_id is not a Redfish Id");
  }
  return absl::OkStatus();
}

// Whether `text` is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
bool IsUtf8(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t n = 0;
    uint32_t cp = 0;
    if ((c >> 5) == 0x6) {
      n = 1, cp = c & 0x1f;
    } else if ((c >> 4) == 0xe) {
      n = 2, cp = c & 0x0f;
    } else if ((c >> 3) == 0x1e) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= text.size()) return false;
    for (std::size_t k = 1; k <= n; ++k) {
      auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (next & 0x3f);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n + 1;
  }
  return true;
}

// "user:password", split at the first colon.
absl::StatusOr<std::pair<std::string, std::string>> SplitCredential(const std::string& value,
                                                                    const std::string& ref) {
  std::size_t colon = value.find(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(
        fmt::format("the secret {} is not a BMC credential (user:password)", ref));
  }
  // Redfish sends both in JSON, which holds text only.
  if (!IsUtf8(value)) {
    return absl::InvalidArgumentError(
        fmt::format("the secret {} is not a BMC credential: it is not UTF-8 text", ref));
  }
  return std::make_pair(value.substr(0, colon), value.substr(colon + 1));
}

// What every bmc.* handler shares: the options, the secrets, where to log.
struct BmcContext {
  BmcOptions options;
  IpmiOptions ipmi;
  SecretClient* secrets = nullptr;
  Logger* log = nullptr;
};

// One command's connection to its BMC.
struct Connected {
  std::unique_ptr<BmcSession> session;
  site::BmcProtocol protocol = site::BMC_PROTOCOL_AUTO;
  BmcEndpoint endpoint;
};

class BmcConnector {
 public:
  explicit BmcConnector(const BmcContext* context) : c_(context) {}

  // The endpoint for `target` with `user`/`password`, for the command's time.
  absl::StatusOr<BmcEndpoint> Endpoint(const v1::Command& command, const site::BmcTarget& target,
                                       const std::string& user, const std::string& password,
                                       const std::atomic<bool>& stop) const {
    Address address = *ParseAddress(target.address());
    BmcEndpoint e;
    e.host = address.host;
    e.port = address.port.value_or(0);
    e.user = user;
    e.password = password;
    e.system_id = target.system_id();
    e.stop = &stop;
    e.exchange_timeout = c_->options.exchange_timeout;
    // The lane's timeout stops the command with `stop`; this deadline keeps each wait within it.
    int64_t timeout_ms =
        command.timeout_seconds() > 0 ? int64_t{command.timeout_seconds()} * 1000 : 120000;
    e.deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    if (!target.tls_spki_sha256().empty()) {
      e.trust.spki_sha256 = target.tls_spki_sha256();
    } else if (!c_->options.ca_file.empty()) {
      e.trust.ca_file = c_->options.ca_file;
    } else if (std::find(c_->options.tls_unverified.begin(), c_->options.tls_unverified.end(),
                         target.address()) != c_->options.tls_unverified.end()) {
      e.trust.unverified = true;
    }
    return e;
  }

  // Opens a session as `user`: the target's protocol, or Redfish then IPMI.
  absl::StatusOr<Connected> Open(BmcEndpoint endpoint, const site::BmcTarget& target) const {
    bool explicit_port = endpoint.port != 0;
    auto redfish = [&]() -> absl::StatusOr<Connected> {
      BmcEndpoint e = endpoint;
      if (!explicit_port) e.port = c_->options.redfish_port;
      if (e.trust.spki_sha256.empty() && e.trust.ca_file.empty() && !e.trust.unverified) {
        return absl::FailedPreconditionError(fmt::format(
            "BMC {}: no tls_spki_sha256 pin and no [site] bmc_ca_file: an unverified Redfish "
            "connection is refused (list the address in [site] bmc_tls_unverified to allow it)",
            target.address()));
      }
      absl::StatusOr<std::unique_ptr<BmcSession>> s = OpenRedfish(e);
      if (!s.ok()) return s.status();
      return Connected{*std::move(s), site::BMC_PROTOCOL_REDFISH, e};
    };
    auto ipmi = [&]() -> absl::StatusOr<Connected> {
      BmcEndpoint e = endpoint;
      if (!explicit_port) e.port = c_->options.ipmi_port;
      absl::StatusOr<std::unique_ptr<BmcSession>> s = OpenIpmi(e, c_->ipmi);
      if (!s.ok()) return s.status();
      return Connected{*std::move(s), site::BMC_PROTOCOL_IPMI, e};
    };
    switch (target.protocol()) {
      case site::BMC_PROTOCOL_REDFISH:
        return redfish();
      case site::BMC_PROTOCOL_IPMI:
        return ipmi();
      default:
        break;
    }
    absl::StatusOr<Connected> first = redfish();
    // Only a BMC that does not serve Redfish is asked over IPMI: one that refused the credential
    // or showed another certificate is not tried again with less protection.
    if (first.ok() || !absl::IsUnimplemented(first.status())) return first;
    absl::StatusOr<Connected> second = ipmi();
    if (second.ok()) return second;
    return absl::Status(
        second.status().code(),
        fmt::format("{}; {}", ToStd(first.status().message()), ToStd(second.status().message())));
  }

 private:
  const BmcContext* c_;
};

// The credential of `ref` for `command`.
absl::StatusOr<std::pair<std::string, std::string>> Credential(const BmcContext& c,
                                                               const v1::Command& command,
                                                               const std::string& ref) {
  absl::StatusOr<std::vector<std::string>> values = c.secrets->ResolveFor(command, {ref});
  if (!values.ok()) return values.status();
  return SplitCredential(values->front(), ref);
}

// Runs `act` on a session opened for `command`'s target, closing it whatever happens, and logs
// the outcome (the BMC, the protocol, the error: never the credential).
template <class Act>
auto WithBmc(const BmcContext& c, const v1::Command& command, const site::BmcTarget& target,
             const std::atomic<bool>& stop, Act act) -> decltype(act(std::declval<Connected&>())) {
  absl::StatusOr<std::pair<std::string, std::string>> credential =
      Credential(c, command, target.credential_ref());
  if (!credential.ok()) return credential.status();
  BmcConnector connector(&c);
  absl::StatusOr<BmcEndpoint> endpoint =
      connector.Endpoint(command, target, credential->first, credential->second, stop);
  if (!endpoint.ok()) return endpoint.status();
  absl::StatusOr<Connected> connected = connector.Open(*endpoint, target);
  if (!connected.ok()) {
    c.log->Warn("bmc.failed", {{"command_id", command.command_id()},
                               {"kind", command.kind()},
                               {"bmc", target.address()},
                               {"error", std::string(ToStd(connected.status().message()))}});
    return connected.status();
  }
  auto result = act(*connected);
  connected->session->Close();
  if (!result.ok()) {
    c.log->Warn("bmc.failed", {{"command_id", command.command_id()},
                               {"kind", command.kind()},
                               {"bmc", target.address()},
                               {"protocol", std::string(ProtocolName(connected->protocol))},
                               {"error", std::string(ToStd(result.status().message()))}});
  } else {
    c.log->Info("bmc.done", {{"command_id", command.command_id()},
                             {"kind", command.kind()},
                             {"bmc", target.address()},
                             {"protocol", std::string(ProtocolName(connected->protocol))}});
  }
  return result;
}

std::string LaneKeyOf(const site::BmcTarget& target) {
  // One BMC, however its address is spelled in case.
  std::optional<Address> address = ParseAddress(target.address());
  if (!address) return target.address();
  std::string key = absl::AsciiStrToLower(ToAbsl(address->host));
  if (address->port) key += ":" + std::to_string(*address->port);
  return key;
}

class BmcPowerHandler final : public TypedHandler<site::BmcPowerPayload, site::BmcPowerResult> {
 public:
  // `action` empty: bmc.powerStatus.
  BmcPowerHandler(std::shared_ptr<const BmcContext> context, std::optional<PowerAction> action)
      : c_(std::move(context)), action_(action) {}

  absl::Status Check(const v1::Command&, const site::BmcPowerPayload& payload) const override {
    return CheckTarget(payload.bmc());
  }
  std::string Key(const v1::Command&, const site::BmcPowerPayload& payload) const override {
    return LaneKeyOf(payload.bmc());
  }

  absl::StatusOr<site::BmcPowerResult> Execute(const v1::Command& command,
                                               const site::BmcPowerPayload& payload,
                                               const std::atomic<bool>& stop) override {
    return WithBmc(*c_, command, payload.bmc(), stop,
                   [&](Connected& bmc) -> absl::StatusOr<site::BmcPowerResult> {
                     site::BmcPowerResult result;
                     result.set_protocol(bmc.protocol);
                     absl::StatusOr<std::string> state = bmc.session->PowerState();
                     if (!state.ok()) return state.status();
                     if (action_) {
                       std::string want = *action_ == PowerAction::kOff ? "off" : "on";
                       // A cycle of a machine that is off powers it on.
                       PowerAction action = *action_ == PowerAction::kCycle && *state == "off"
                                                ? PowerAction::kOn
                                                : *action_;
                       if (absl::Status s = bmc.session->Power(action); !s.ok()) return s;
                       state = WaitForPower(*bmc.session, bmc.endpoint, want);
                       if (!state.ok()) return state.status();
                       if (*state != want) {
                         return absl::DeadlineExceededError(fmt::format(
                             "BMC {}: asked for power {}, still {} when the command's time ran out",
                             payload.bmc().address(), want, *state));
                       }
                     }
                     result.set_power_state(*state);
                     return result;
                   });
  }

 private:
  std::shared_ptr<const BmcContext> c_;
  std::optional<PowerAction> action_;
};

class BmcBootHandler final
    : public TypedHandler<site::BmcSetBootDevicePayload, site::BmcSetBootDeviceResult> {
 public:
  explicit BmcBootHandler(std::shared_ptr<const BmcContext> context) : c_(std::move(context)) {}

  absl::Status Check(const v1::Command&,
                     const site::BmcSetBootDevicePayload& payload) const override {
    if (absl::Status s = CheckTarget(payload.bmc()); !s.ok()) return s;
    const std::string& d = payload.device();
    if (d != "pxe" && d != "disk" && d != "cdrom" && d != "bios") {
      return absl::InvalidArgumentError(
          fmt::format("device \"{}\" is not one of pxe, disk, cdrom, bios", d.substr(0, 50)));
    }
    return absl::OkStatus();
  }
  std::string Key(const v1::Command&, const site::BmcSetBootDevicePayload& payload) const override {
    return LaneKeyOf(payload.bmc());
  }

  absl::StatusOr<site::BmcSetBootDeviceResult> Execute(const v1::Command& command,
                                                       const site::BmcSetBootDevicePayload& payload,
                                                       const std::atomic<bool>& stop) override {
    return WithBmc(*c_, command, payload.bmc(), stop,
                   [&](Connected& bmc) -> absl::StatusOr<site::BmcSetBootDeviceResult> {
                     if (absl::Status s = bmc.session->SetBoot({.device = payload.device(),
                                                                .persistent = payload.persistent(),
                                                                .uefi = payload.uefi()});
                         !s.ok()) {
                       return s;
                     }
                     absl::StatusOr<std::string> device = bmc.session->BootDevice();
                     if (!device.ok()) return device.status();
                     site::BmcSetBootDeviceResult result;
                     result.set_device(*device);
                     return result;
                   });
  }

 private:
  std::shared_ptr<const BmcContext> c_;
};

class BmcRotateHandler final : public TypedHandler<site::BmcRotatePayload, site::BmcRotateResult> {
 public:
  explicit BmcRotateHandler(std::shared_ptr<const BmcContext> context) : c_(std::move(context)) {}

  absl::Status Check(const v1::Command&, const site::BmcRotatePayload& payload) const override {
    if (absl::Status s = CheckTarget(payload.bmc()); !s.ok()) return s;
    if (payload.new_credential_ref().empty())
      return absl::InvalidArgumentError("new_credential_ref is empty");
    if (payload.new_credential_ref() == payload.bmc().credential_ref())
      return absl::InvalidArgumentError("new_credential_ref is the current credential's ref");
    return absl::OkStatus();
  }
  std::string Key(const v1::Command&, const site::BmcRotatePayload& payload) const override {
    return LaneKeyOf(payload.bmc());
  }

  absl::StatusOr<site::BmcRotateResult> Execute(const v1::Command& command,
                                                const site::BmcRotatePayload& payload,
                                                const std::atomic<bool>& stop) override {
    const site::BmcTarget& target = payload.bmc();
    absl::StatusOr<std::pair<std::string, std::string>> next =
        Credential(*c_, command, payload.new_credential_ref());
    if (!next.ok()) return next.status();
    return WithBmc(
        *c_, command, target, stop, [&](Connected& bmc) -> absl::StatusOr<site::BmcRotateResult> {
          if (next->first != bmc.endpoint.user) {
            return absl::InvalidArgumentError(fmt::format(
                "BMC {}: the new credential is for user {}, the current one for {}: bmc.rotate "
                "changes one user's password",
                target.address(), next->first, bmc.endpoint.user));
          }
          if (absl::Status s = bmc.session->SetPassword(next->second); !s.ok()) return s;
          // Verify with a login of its own, the way the next command will log in.
          BmcEndpoint again = bmc.endpoint;
          again.password = next->second;
          site::BmcTarget same = target;  // the protocol and port that answered
          same.set_protocol(bmc.protocol);
          BmcConnector connector(c_.get());
          absl::StatusOr<Connected> verify = connector.Open(again, same);
          if (verify.ok()) {
            verify->session->Close();
            site::BmcRotateResult result;
            result.set_verified(true);
            return result;
          }
          // The BMC took the password but will not let it in: put the old one back if the
          // session still allows it.
          absl::Status restored = bmc.session->SetPassword(bmc.endpoint.password);
          return absl::FailedPreconditionError(
              fmt::format("BMC {}: the new password was set but a login with it failed ({}); {}",
                          target.address(), ToStd(verify.status().message()),
                          restored.ok() ? "the old password was restored"
                                        : "the old password could not be restored: " +
                                              std::string(ToStd(restored.message()))));
        });
  }

 private:
  std::shared_ptr<const BmcContext> c_;
};

}  // namespace

absl::Status RegisterBmcKinds(const ModeContext& context, const BmcOptions& options) {
  if (context.secrets == nullptr)
    return absl::FailedPreconditionError("the bmc kinds need the secret client");
  std::filesystem::path work = context.state_dir / "bmc";
  std::error_code ec;
  std::filesystem::create_directories(work, ec);
  if (ec || chmod(work.c_str(), 0700) != 0) {
    return absl::InternalError(fmt::format("{}: cannot make the BMC work directory: {}",
                                           work.string(),
                                           ec ? ec.message() : std::string(strerror(errno))));
  }
  // Owned by the handlers' closure: one shared context for all six, kept as long as the dispatcher.
  auto shared = std::make_shared<BmcContext>();
  shared->options = options;
  shared->ipmi = {
      .ipmitool = options.ipmitool, .work_dir = work, .suites = std::make_shared<IpmiSuites>()};
  shared->secrets = context.secrets;
  shared->log = context.log;
  std::shared_ptr<const BmcContext> c = shared;
  struct Entry {
    const char* kind;
    std::unique_ptr<CommandHandler> handler;
  };
  Entry entries[] = {
      {"bmc.powerOn", std::make_unique<BmcPowerHandler>(c, PowerAction::kOn)},
      {"bmc.powerOff", std::make_unique<BmcPowerHandler>(c, PowerAction::kOff)},
      {"bmc.powerCycle", std::make_unique<BmcPowerHandler>(c, PowerAction::kCycle)},
      {"bmc.powerStatus", std::make_unique<BmcPowerHandler>(c, std::nullopt)},
      {"bmc.setBootDevice", std::make_unique<BmcBootHandler>(c)},
      {"bmc.rotate", std::make_unique<BmcRotateHandler>(c)},
  };
  for (Entry& entry : entries) {
    if (absl::Status s = context.dispatcher->Register(entry.kind, std::move(entry.handler));
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace bcd
