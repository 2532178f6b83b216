#include "modes/site/http_proxy.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "base/net.h"
#include "bettercompute/site/v1/site.pb.h"
#include "daemon/dispatch/dispatcher.h"
#include "daemon/secrets/secrets.h"
#include "fmt/format.h"
#include "proto/absl_compat.h"
#include "transport/http_client.h"

namespace bcd {
namespace {

namespace v1 = bettercompute::agent::v1;
namespace site = bettercompute::site::v1;

constexpr std::size_t kMaxRequestBody = 1 << 20;

// Blocks reachable only by a rule that names a block inside them.
struct Special {
  const char* block;
  int prefix;
};
constexpr Special kGuarded[] = {
    {"127.0.0.0/8", 8}, {"169.254.0.0/16", 16}, {"::1", 128}, {"fe80::/10", 10}};
constexpr const char* kNever[] = {"0.0.0.0/8", "224.0.0.0/4", "255.255.255.255", "::", "ff00::/8"};

// An IPv4-mapped IPv6 address as the IPv4 address it is.
std::string Unmapped(const std::string& address) {
  if (absl::StartsWithIgnoreCase(ToAbsl(address), "::ffff:") && IsIpv4(address.substr(7)))
    return address.substr(7);
  return address;
}

std::vector<std::string> SystemResolve(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  std::vector<std::string> addresses;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return addresses;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, text, sizeof text);
    } else if (a->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr, text,
                sizeof text);
    } else {
      continue;
    }
    if (std::find(addresses.begin(), addresses.end(), text) == addresses.end())
      addresses.emplace_back(text);
  }
  freeaddrinfo(found);
  return addresses;
}

bool MethodText(const std::string& method) {
  if (method.empty() || method.size() > 16) return false;
  return std::all_of(method.begin(), method.end(), [](char c) { return c >= 'A' && c <= 'Z'; });
}

// Every occurrence of each of `secrets` in `text` replaced.
void Redact(std::string& text, const std::vector<std::string>& secrets) {
  for (const std::string& secret : secrets) {
    if (secret.empty()) continue;
    for (std::size_t at = text.find(secret); at != std::string::npos;
         at = text.find(secret, at + 10)) {
      text.replace(at, secret.size(), "[redacted]");
    }
  }
}

class HttpProxyHandler final : public TypedHandler<site::HttpProxyPayload, site::HttpProxyResult> {
 public:
  HttpProxyHandler(HttpProxyOptions options, SecretClient* secrets, Logger* log)
      : options_(std::move(options)), secrets_(secrets), log_(log) {
    if (!options_.resolve) options_.resolve = SystemResolve;
  }

  absl::Status Check(const v1::Command&, const site::HttpProxyPayload& p) const override {
    if (!MethodText(p.method())) {
      return absl::InvalidArgumentError(fmt::format(
          "method: expected an HTTP method in capitals, got \"{}\"", p.method().substr(0, 32)));
    }
    absl::StatusOr<Url> url = Url::Parse(p.url(), {"http", "https"}, /*allow_query=*/true);
    if (!url.ok())
      return absl::InvalidArgumentError(fmt::format("url: {}", ToStd(url.status().message())));
    for (const auto& [name, value] : p.headers()) {
      if (!SafeRequestHeader(name, value))
        return absl::InvalidArgumentError(
            fmt::format("header \"{}\" is not allowed", name.substr(0, 64)));
    }
    for (const auto& [name, ref] : p.secret_headers()) {
      if (!SafeRequestHeader(name, "") || ref.empty()) {
        return absl::InvalidArgumentError(
            fmt::format("secret header \"{}\": expected a header name and a secret reference",
                        name.substr(0, 64)));
      }
      if (p.headers().contains(name)) {
        return absl::InvalidArgumentError(
            fmt::format("header \"{}\" is both plain and secret", name.substr(0, 64)));
      }
    }
    if (p.body().size() > kMaxRequestBody) {
      return absl::InvalidArgumentError(
          fmt::format("body: {} bytes, more than {}", p.body().size(), kMaxRequestBody));
    }
    if (p.max_response_bytes() > kMaxResponseBytes) {
      return absl::InvalidArgumentError(fmt::format("max_response_bytes: {} is more than {}",
                                                    p.max_response_bytes(), kMaxResponseBytes));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<site::HttpProxyResult> Execute(const v1::Command& command,
                                                const site::HttpProxyPayload& p,
                                                const std::atomic<bool>& stop) override {
    Url url = *Url::Parse(p.url(), {"http", "https"}, /*allow_query=*/true);
    std::vector<std::string> resolved =
        url.host_is_ip() ? std::vector<std::string>{url.host()} : options_.resolve(url.host());
    if (resolved.empty()) {
      return Failed(
          command, url,
          absl::UnavailableError(fmt::format("{}: the name does not resolve", url.host())));
    }
    std::vector<std::string> allowed, refused;
    for (const std::string& address : resolved) {
      absl::Status s = CheckProxyDestination(options_.allow, address, url.port());
      if (s.ok()) {
        allowed.push_back(address);
      } else {
        refused.push_back(std::string(ToStd(s.message())));
      }
    }
    if (allowed.empty()) {
      return Failed(command, url,
                    absl::PermissionDeniedError(
                        fmt::format("{} is not a destination site.httpProxy may reach: {}",
                                    url.host(), absl::StrJoin(refused, "; "))));
    }
    // In name order (a map's order is unspecified), so values pair with names.
    std::map<std::string, std::string> secret(p.secret_headers().begin(), p.secret_headers().end());
    std::vector<std::string> names, refs;
    for (const auto& [name, ref] : secret) {
      names.push_back(name);
      refs.push_back(ref);
    }
    std::vector<std::string> values;
    if (!refs.empty()) {
      absl::StatusOr<std::vector<std::string>> got = secrets_->ResolveFor(command, refs);
      if (!got.ok()) return Failed(command, url, got.status());
      values = *std::move(got);
      for (std::size_t i = 0; i < values.size(); ++i) {
        if (!SafeRequestHeader(names[i], values[i])) {
          return Failed(
              command, url,
              absl::InvalidArgumentError(fmt::format(
                  "the secret {} cannot be a header value (a line break or NUL)", refs[i])));
        }
      }
    }
    SiteHttpRequest request{
        .method = p.method(),
        .host = url.host(),
        .port = url.port(),
        .tls = url.scheme() == "https",
        .target = url.target(),
        .addresses = allowed,
        .body = p.body(),
        .ca_file = options_.ca_file,
        .max_body = p.max_response_bytes() == 0 ? kDefaultResponseBytes : p.max_response_bytes(),
        .timeout = kHttpProxyTimeout,
        .stop = &stop};
    for (const auto& [name, value] : p.headers()) request.headers.emplace_back(name, value);
    for (std::size_t i = 0; i < names.size(); ++i)
      request.headers.emplace_back(names[i], values[i]);
    absl::StatusOr<SiteHttpAnswer> answer = HttpSiteExchange(request);
    if (!answer.ok()) return Failed(command, url, answer.status());
    site::HttpProxyResult result;
    result.set_status(answer->status);
    for (auto& [name, value] : answer->headers) {
      Redact(value, values);
      auto& slot = (*result.mutable_headers())[absl::AsciiStrToLower(ToAbsl(name))];
      if (!slot.empty()) slot += ", ";
      slot += value;
    }
    Redact(answer->body, values);
    result.set_body(std::move(answer->body));
    result.set_truncated(answer->truncated);
    log_->Info("site.http_proxy", {{"command_id", command.command_id()},
                                   {"method", p.method()},
                                   {"host", url.host()},
                                   {"port", std::to_string(url.port())},
                                   {"status", std::to_string(answer->status)},
                                   {"bytes", std::to_string(result.body().size())},
                                   {"truncated", answer->truncated ? "true" : "false"}});
    return result;
  }

 private:
  absl::Status Failed(const v1::Command& command, const Url& url, absl::Status status) const {
    log_->Warn("site.http_proxy_failed", {{"command_id", command.command_id()},
                                          {"host", url.host()},
                                          {"port", std::to_string(url.port())},
                                          {"error", std::string(ToStd(status.message()))}});
    return status;
  }

  HttpProxyOptions options_;
  SecretClient* secrets_;
  Logger* log_;
};

}  // namespace

absl::Status CheckProxyDestination(const std::vector<TunnelAllowRule>& allow,
                                   const std::string& raw, uint16_t port) {
  std::string address = Unmapped(raw);
  for (const char* block : kNever) {
    if (InCidr(block, address)) {
      return absl::PermissionDeniedError(
          fmt::format("{} is an unspecified or multicast address", address));
    }
  }
  const Special* guarded = nullptr;
  for (const Special& special : kGuarded) {
    if (InCidr(special.block, address)) guarded = &special;
  }
  for (const TunnelAllowRule& rule : allow) {
    if (!rule.Allows("", address, port)) continue;
    if (guarded == nullptr) return absl::OkStatus();
    // The rule must name a block inside the guarded one: its base there, its prefix as long.
    std::string base = rule.host.substr(0, rule.host.find('/'));
    int prefix = rule.host.find('/') == std::string::npos
                     ? (IsIpv4(base) ? 32 : 128)
                     : std::atoi(rule.host.c_str() + rule.host.find('/') + 1);
    if (InCidr(guarded->block, base) && prefix >= guarded->prefix) return absl::OkStatus();
  }
  if (guarded != nullptr) {
    return absl::PermissionDeniedError(fmt::format(
        "{} is a loopback or link-local address: only a [site] http_proxy_allow rule naming it "
        "reaches it",
        address));
  }
  return absl::PermissionDeniedError(
      fmt::format("{} port {} is not in [site] http_proxy_allow", address, port));
}

absl::Status RegisterHttpProxy(const ModeContext& context, HttpProxyOptions options) {
  if (context.secrets == nullptr)
    return absl::FailedPreconditionError("site.httpProxy needs the secret client");
  return context.dispatcher->Register(
      "site.httpProxy",
      std::make_unique<HttpProxyHandler>(std::move(options), context.secrets, context.log));
}

}  // namespace bcd
