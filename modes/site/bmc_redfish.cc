// Redfish (DMTF DSP0266) as a BmcSession: the service root, SessionService sessions with basic
// auth as the fallback, ComputerSystem.Reset with the BMC's allowable reset types, the boot
// override with ETags, and the account service for a new password.

#include <algorithm>
#include <thread>
#include <vector>

#include "absl/strings/str_join.h"
#include "fmt/format.h"
#include "modes/site/bmc.h"
#include "nlohmann/json.hpp"
#include "proto/absl_compat.h"

namespace bcd {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string Base64(std::string_view in) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  std::size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t n = (static_cast<uint8_t>(in[i]) << 16) | (static_cast<uint8_t>(in[i + 1]) << 8) |
                 static_cast<uint8_t>(in[i + 2]);
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += kAlphabet[(n >> 6) & 63];
    out += kAlphabet[n & 63];
  }
  if (i + 1 == in.size()) {
    uint32_t n = static_cast<uint8_t>(in[i]) << 16;
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    uint32_t n = (static_cast<uint8_t>(in[i]) << 16) | (static_cast<uint8_t>(in[i + 1]) << 8);
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += kAlphabet[(n >> 6) & 63];
    out += '=';
  }
  return out;
}

// Our boot device names and Redfish's BootSourceOverrideTarget values.
constexpr std::pair<const char*, const char*> kBootTargets[] = {
    {"pxe", "Pxe"}, {"disk", "Hdd"}, {"cdrom", "Cd"}, {"bios", "BiosSetup"}, {"none", "None"}};

// What a BMC sends is read without trusting its shape: a member of something that is not an
// object is null, a string that is not a string is "".
const json& Field(const json& j, const char* key) {
  static const json kNull;
  if (!j.is_object()) return kNull;
  auto found = j.find(key);
  return found == j.end() ? kNull : *found;
}
std::string Text(const json& j, const char* key) {
  const json& f = Field(j, key);
  return f.is_string() ? f.get<std::string>() : std::string();
}
// The @odata.id of the link `key` of `j`.
std::string Link(const json& j, const char* key) { return Text(Field(j, key), "@odata.id"); }

std::string StringsOf(const json& array) {
  std::vector<std::string> names;
  if (array.is_array()) {
    for (const json& v : array) {
      if (v.is_string()) names.push_back(v.get<std::string>());
    }
  }
  return names.empty() ? "nothing" : absl::StrJoin(names, ", ");
}

bool Contains(const json& array, const std::string& value) {
  if (!array.is_array()) return false;
  return std::any_of(array.begin(), array.end(),
                     [&](const json& v) { return v.is_string() && v.get<std::string>() == value; });
}

class RedfishSession final : public BmcSession {
 public:
  explicit RedfishSession(BmcEndpoint endpoint) : e_(std::move(endpoint)) {}
  ~RedfishSession() override { Close(); }

  // The service root, the login and the system: what every command needs first.
  absl::Status Open() {
    absl::StatusOr<DeviceAnswer> root = Exchange("GET", "/redfish/v1", "", /*auth=*/false);
    if (!root.ok()) {
      // Nothing listening on the port is "not served"; no answer at all is not.
      if (absl::IsUnavailable(root.status()) &&
          root.status().message().find("refused") != std::string_view::npos) {
        return absl::UnimplementedError(
            fmt::format("{}: Redfish is not served ({})", Where(), ToStd(root.status().message())));
      }
      return root.status();
    }
    json service = json::parse(root->body, nullptr, false);
    if (root->status != 200 || !service.is_object()) {
      return absl::UnimplementedError(
          fmt::format("{}: Redfish is not served (GET /redfish/v1 answered {}{})", Where(),
                      root->status, service.is_object() ? "" : " without a JSON object"));
    }
    if (absl::Status s = LogIn(service); !s.ok()) return s;
    return FindSystem(service);
  }

  absl::StatusOr<std::string> PowerState() override {
    absl::StatusOr<json> system = Get(system_path_);
    if (!system.ok()) return system.status();
    std::string state = Text(*system, "PowerState");
    if (state == "On") return std::string("on");
    if (state == "Off") return std::string("off");
    if (state == "PoweringOn") return std::string("powering-on");
    if (state == "PoweringOff") return std::string("powering-off");
    return state.empty() ? std::string("unknown") : state;
  }

  absl::Status Power(PowerAction action) override {
    absl::StatusOr<json> system = Get(system_path_);
    if (!system.ok()) return system.status();
    const json& reset = Field(Field(*system, "Actions"), "#ComputerSystem.Reset");
    std::string target = Text(reset, "target");
    if (target.empty()) {
      return absl::FailedPreconditionError(
          fmt::format("{}: the system offers no ComputerSystem.Reset action", Where()));
    }
    const json& allowed = Field(reset, "ResetType@Redfish.AllowableValues");
    auto offered = [&](const std::string& type) {
      // A BMC that lists nothing is taken to allow the standard types.
      return !allowed.is_array() || Contains(allowed, type);
    };
    std::vector<std::string> wanted;
    switch (action) {
      case PowerAction::kOn:
        wanted = {"On", "ForceOn", "PushPowerButton"};
        break;
      case PowerAction::kOff:
        wanted = {"ForceOff", "GracefulShutdown"};
        break;
      case PowerAction::kCycle:
        wanted = {"PowerCycle", "ForceRestart"};
        break;
    }
    for (const std::string& type : wanted) {
      if (!offered(type)) continue;
      return Reset(target, type);
    }
    if (action == PowerAction::kCycle && offered("ForceOff") && offered("On")) {
      // No cycle: off, then on once the BMC says it is off.
      if (absl::Status s = Reset(target, "ForceOff"); !s.ok()) return s;
      absl::StatusOr<std::string> off = WaitForPower(*this, e_, "off");
      if (!off.ok()) return off.status();
      if (*off != "off") {
        return absl::UnavailableError(
            fmt::format("{}: power cycle: still {} after ForceOff", Where(), *off));
      }
      return Reset(target, "On");
    }
    return absl::FailedPreconditionError(
        fmt::format("{}: the BMC allows no reset type for power {} (it allows {})", Where(),
                    action == PowerAction::kOn    ? "on"
                    : action == PowerAction::kOff ? "off"
                                                  : "cycle",
                    StringsOf(allowed)));
  }

  absl::Status SetBoot(const BootChoice& choice) override {
    std::string target;
    for (const auto& [ours, theirs] : kBootTargets) {
      if (choice.device == ours) target = theirs;
    }
    for (int attempt = 0;; ++attempt) {
      absl::StatusOr<DeviceAnswer> got = Exchange("GET", system_path_, "");
      if (!got.ok()) return got.status();
      json system = json::parse(got->body, nullptr, false);
      if (got->status != 200 || !system.is_object()) return Refused("GET", system_path_, *got);
      const json& boot = Field(system, "Boot");
      if (!boot.is_object()) {
        return absl::FailedPreconditionError(
            fmt::format("{}: the system has no boot override (no Boot property)", Where()));
      }
      const json& targets = Field(boot, "BootSourceOverrideTarget@Redfish.AllowableValues");
      if (targets.is_array() && !Contains(targets, target)) {
        return absl::FailedPreconditionError(
            fmt::format("{}: the BMC does not offer boot from {} ({}); it offers {}", Where(),
                        choice.device, target, StringsOf(targets)));
      }
      json patch = {{"Boot",
                     {{"BootSourceOverrideTarget", target},
                      {"BootSourceOverrideEnabled", choice.persistent ? "Continuous" : "Once"}}}};
      if (boot.contains("BootSourceOverrideMode")) {
        patch["Boot"]["BootSourceOverrideMode"] = choice.uefi ? "UEFI" : "Legacy";
      } else if (choice.uefi) {
        return absl::FailedPreconditionError(fmt::format(
            "{}: the BMC has no BootSourceOverrideMode: cannot ask for a UEFI boot", Where()));
      }
      std::map<std::string, std::string> headers;
      std::string etag = EtagOf(*got, system);
      if (!etag.empty()) headers["If-Match"] = etag;
      absl::StatusOr<DeviceAnswer> patched =
          Exchange("PATCH", system_path_, patch.dump(), true, headers);
      if (!patched.ok()) return patched.status();
      // Someone changed the system between our GET and PATCH: read it again, once.
      if (patched->status == 412 && attempt == 0) continue;
      if (patched->status / 100 != 2) return Refused("PATCH", system_path_, *patched);
      return absl::OkStatus();
    }
  }

  absl::StatusOr<std::string> BootDevice() override {
    absl::StatusOr<json> system = Get(system_path_);
    if (!system.ok()) return system.status();
    const json& boot = Field(*system, "Boot");
    std::string target = Text(boot, "BootSourceOverrideTarget");
    std::string enabled = Text(boot, "BootSourceOverrideEnabled");
    if (enabled == "Disabled") return std::string("none");
    for (const auto& [ours, theirs] : kBootTargets) {
      if (target == theirs) return std::string(ours);
    }
    return target.empty() ? std::string("unknown") : target;
  }

  absl::Status SetPassword(const std::string& password) override {
    if (account_path_.empty()) {
      absl::StatusOr<json> service = Get("/redfish/v1");
      if (!service.ok()) return service.status();
      std::string accounts_service = Link(*service, "AccountService");
      if (accounts_service.empty()) {
        return absl::FailedPreconditionError(
            fmt::format("{}: the BMC offers no AccountService", Where()));
      }
      absl::StatusOr<json> accounts_root = Get(accounts_service);
      if (!accounts_root.ok()) return accounts_root.status();
      std::string accounts = Link(*accounts_root, "Accounts");
      absl::StatusOr<json> members = Get(accounts);
      if (!members.ok()) return members.status();
      const json& list = Field(*members, "Members");
      for (const json& member : list.is_array() ? list : json::array()) {
        std::string path = Text(member, "@odata.id");
        absl::StatusOr<json> account = Get(path);
        if (!account.ok()) return account.status();
        if (Text(*account, "UserName") == e_.user) {
          account_path_ = path;
          break;
        }
      }
      if (account_path_.empty()) {
        return absl::NotFoundError(
            fmt::format("{}: no account named {} in the account service", Where(), e_.user));
      }
    }
    absl::StatusOr<DeviceAnswer> got = Exchange("GET", account_path_, "");
    if (!got.ok()) return got.status();
    json account = json::parse(got->body, nullptr, false);
    std::map<std::string, std::string> headers;
    std::string etag = EtagOf(*got, account);
    if (!etag.empty()) headers["If-Match"] = etag;
    json patch = {{"Password", password}};
    absl::StatusOr<DeviceAnswer> patched =
        Exchange("PATCH", account_path_, patch.dump(), true, headers);
    if (!patched.ok()) return patched.status();
    if (patched->status / 100 != 2) return Refused("PATCH", account_path_, *patched);
    return absl::OkStatus();
  }

  void Close() override {
    if (session_path_.empty()) return;
    std::string path = std::exchange(session_path_, "");
    (void)Exchange("DELETE", path, "");
    token_.clear();
  }

 private:
  std::string Where() const {
    return e_.host.find(':') != std::string::npos ? fmt::format("BMC [{}]:{}", e_.host, e_.port)
                                                  : fmt::format("BMC {}:{}", e_.host, e_.port);
  }

  absl::StatusOr<DeviceAnswer> Exchange(const std::string& method, const std::string& path,
                                        const std::string& body, bool auth = true,
                                        std::map<std::string, std::string> headers = {}) {
    // Paths come from the BMC's own links: one that is not a plain path is not followed.
    bool plain = !path.empty() && path[0] == '/' && path.size() <= 1024;
    for (char c : path) plain = plain && static_cast<unsigned char>(c) > ' ' && c != 0x7f;
    if (!plain) {
      return absl::FailedPreconditionError(
          fmt::format("{}: the BMC linked to something that is not a path: \"{}\"", Where(),
                      path.substr(0, 100)));
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(e_.deadline - Clock::now());
    if (left.count() <= 0) {
      return absl::DeadlineExceededError(fmt::format("{}: out of time", Where()));
    }
    DeviceRequest request{.method = method,
                          .host = e_.host,
                          .port = e_.port,
                          .target = path,
                          .headers = std::move(headers),
                          .body = body,
                          .trust = e_.trust,
                          .timeout = std::min(left, e_.exchange_timeout),
                          .stop = e_.stop};
    request.headers["Accept"] = "application/json";
    request.headers["OData-Version"] = "4.0";
    if (!body.empty()) request.headers["Content-Type"] = "application/json";
    if (auth && !token_.empty()) request.headers["X-Auth-Token"] = token_;
    if (auth && token_.empty()) {
      request.headers["Authorization"] = "Basic " + Base64(e_.user + ":" + e_.password);
    }
    absl::StatusOr<DeviceAnswer> answer =
        e_.exchange ? e_.exchange(request) : connection_.Exchange(request);
    if (!answer.ok()) {
      // The exchange's own errors start with the host; say which BMC and protocol.
      std::string why(ToStd(answer.status().message()));
      if (why.starts_with(e_.host + ": ")) why = why.substr(e_.host.size() + 2);
      return absl::Status(answer.status().code(),
                          fmt::format("BMC {} (Redfish): {}", e_.host, why));
    }
    if (auth && (answer->status == 401 || answer->status == 403)) {
      return absl::UnauthenticatedError(
          fmt::format("{}: the BMC refused the credential of {} ({} on {} {})", Where(), e_.user,
                      answer->status, method, path));
    }
    return answer;
  }

  absl::StatusOr<json> Get(const std::string& path) {
    absl::StatusOr<DeviceAnswer> answer = Exchange("GET", path, "");
    if (!answer.ok()) return answer.status();
    json body = json::parse(answer->body, nullptr, false);
    if (answer->status != 200 || !body.is_object()) return Refused("GET", path, *answer);
    return body;
  }

  absl::Status Refused(const std::string& method, const std::string& path,
                       const DeviceAnswer& answer) const {
    // A Redfish error names itself in error.message or @Message.ExtendedInfo.
    std::string why;
    json body = json::parse(answer.body, nullptr, false);
    const json& error = Field(body, "error");
    why = Text(error, "message");
    const json& info = Field(error, "@Message.ExtendedInfo");
    if (info.is_array() && !info.empty() && !Text(info[0], "Message").empty())
      why = Text(info[0], "Message");
    for (char& c : why) {
      if (static_cast<unsigned char>(c) < ' ') c = ' ';  // one line, whatever the BMC sent
    }
    std::string text = fmt::format("{}: {} {} answered {}{}{}", Where(), method, path,
                                   answer.status, why.empty() ? "" : ": ", why.substr(0, 200));
    if (answer.status == 404) return absl::NotFoundError(text);
    if (answer.status == 400 || answer.status == 405 || answer.status == 412 ||
        answer.status == 428)
      return absl::FailedPreconditionError(text);
    return absl::UnavailableError(text);
  }

  static std::string EtagOf(const DeviceAnswer& answer, const json& body) {
    auto header = answer.headers.find("etag");
    if (header != answer.headers.end()) return header->second;
    return Text(body, "@odata.etag");
  }

  absl::Status LogIn(const json& service) {
    std::string sessions;
    sessions = Link(Field(service, "Links"), "Sessions");
    if (!sessions.empty()) {
      json login = {{"UserName", e_.user}, {"Password", e_.password}};
      absl::StatusOr<DeviceAnswer> answer =
          Exchange("POST", sessions, login.dump(), /*auth=*/false);
      if (!answer.ok()) return answer.status();
      if (answer->status == 401 || answer->status == 403) {
        return absl::UnauthenticatedError(
            fmt::format("{}: the BMC refused the credential of {} (session login answered {})",
                        Where(), e_.user, answer->status));
      }
      auto token = answer->headers.find("x-auth-token");
      if (answer->status / 100 == 2 && token != answer->headers.end()) {
        token_ = token->second;
        auto location = answer->headers.find("location");
        if (location != answer->headers.end()) {
          session_path_ = location->second;
          // An absolute URL names the same service: keep its path.
          if (std::size_t scheme = session_path_.find("://"); scheme != std::string::npos) {
            std::size_t slash = session_path_.find('/', scheme + 3);
            session_path_ = slash == std::string::npos ? "" : session_path_.substr(slash);
          }
        }
        return absl::OkStatus();
      }
      // No session: basic auth on every request (checked by the first one).
    }
    return absl::OkStatus();
  }

  absl::Status FindSystem(const json& service) {
    std::string systems = Link(service, "Systems");
    if (systems.empty()) {
      return absl::FailedPreconditionError(
          fmt::format("{}: the service root links no Systems", Where()));
    }
    absl::StatusOr<json> collection = Get(systems);
    if (!collection.ok()) return collection.status();
    std::vector<std::string> ids;
    const json& members = Field(*collection, "Members");
    for (const json& member : members.is_array() ? members : json::array()) {
      std::string path = Text(member, "@odata.id");
      std::string id = path.substr(path.find_last_of('/') + 1);
      if (path.empty()) continue;
      ids.push_back(id);
      if (e_.system_id.empty() || id == e_.system_id) {
        system_path_ = path;
        return absl::OkStatus();
      }
    }
    if (ids.empty()) {
      return absl::NotFoundError(fmt::format("{}: the BMC lists no system", Where()));
    }
    return absl::NotFoundError(fmt::format("{}: no system \"{}\" (it has {})", Where(),
                                           e_.system_id, absl::StrJoin(ids, ", ")));
  }

  absl::Status Reset(const std::string& target, const std::string& type) {
    json body = {{"ResetType", type}};
    absl::StatusOr<DeviceAnswer> answer = Exchange("POST", target, body.dump());
    if (!answer.ok()) return answer.status();
    if (answer->status / 100 != 2) return Refused("POST " + type + " to", target, *answer);
    return absl::OkStatus();
  }

  BmcEndpoint e_;
  DeviceConnection connection_;  // one TLS connection for the command, while the BMC keeps it
  std::string token_;
  std::string session_path_;
  std::string system_path_;
  std::string account_path_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BmcSession>> OpenRedfish(const BmcEndpoint& endpoint) {
  auto session = std::make_unique<RedfishSession>(endpoint);
  if (absl::Status s = session->Open(); !s.ok()) return s;
  return std::unique_ptr<BmcSession>(std::move(session));
}

absl::StatusOr<std::string> WaitForPower(BmcSession& session, const BmcEndpoint& endpoint,
                                         const std::string& want) {
  for (;;) {
    absl::StatusOr<std::string> state = session.PowerState();
    if (!state.ok() || *state == want) return state;
    if (Clock::now() + endpoint.poll_interval + std::chrono::milliseconds(50) >=
            endpoint.deadline ||
        (endpoint.stop != nullptr && endpoint.stop->load())) {
      return state;
    }
    std::this_thread::sleep_for(endpoint.poll_interval);
  }
}

}  // namespace bcd
