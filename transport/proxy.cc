#include "transport/proxy.h"

#include <arpa/inet.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <cstring>

#include "absl/strings/ascii.h"
#include "fmt/format.h"
#include "proto/absl_compat.h"

namespace bcd::transport {
namespace {

std::string Lower(std::string_view text) { return absl::AsciiStrToLower(ToAbsl(text)); }

std::string_view Trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())))
    text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
    text.remove_suffix(1);
  return text;
}

std::optional<std::string> PercentDecode(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    if (i + 2 >= text.size()) return std::nullopt;
    unsigned value = 0;
    auto [end, ec] = std::from_chars(text.data() + i + 1, text.data() + i + 3, value, 16);
    if (ec != std::errc() || end != text.data() + i + 3) return std::nullopt;
    out += static_cast<char>(value);
    i += 2;
  }
  return out;
}

std::string Base64(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(bytes.data()),
                          static_cast<int>(bytes.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

// Splits "host[:port]" / "[v6][:port]"; nullopt when malformed.
std::optional<std::pair<std::string, std::optional<uint16_t>>> HostPort(std::string_view text) {
  std::string host;
  std::string_view rest;
  if (text.starts_with('[')) {
    std::size_t close = text.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    host = std::string(text.substr(1, close - 1));
    rest = text.substr(close + 1);
  } else {
    std::size_t colon = text.rfind(':');
    // A bare IPv6 address (more than one colon) has no port.
    if (colon != std::string_view::npos && text.find(':') == colon) {
      host = std::string(text.substr(0, colon));
      rest = text.substr(colon);
    } else {
      host = std::string(text);
    }
  }
  if (host.empty()) return std::nullopt;
  std::optional<uint16_t> port;
  if (!rest.empty()) {
    if (rest.front() != ':') return std::nullopt;
    port = ParsePort(rest.substr(1));
    if (!port) return std::nullopt;
  }
  return std::make_pair(Lower(host), port);
}

}  // namespace

absl::StatusOr<ProxySpec> ParseProxyUrl(std::string_view text) {
  std::string_view rest = Trim(text);
  std::size_t scheme_end = rest.find("://");
  if (scheme_end != std::string_view::npos) {
    std::string scheme = Lower(rest.substr(0, scheme_end));
    if (scheme != "http") {
      return absl::InvalidArgumentError(fmt::format(
          "proxy URL scheme \"{}\" is not supported: bcd speaks HTTP CONNECT to an http:// proxy",
          scheme));
    }
    rest.remove_prefix(scheme_end + 3);
  }
  std::size_t path = rest.find_first_of("/?#");
  if (path != std::string_view::npos) {
    if (rest.substr(path) != "/") {
      return absl::InvalidArgumentError("a proxy URL has no path, query or fragment");
    }
    rest = rest.substr(0, path);
  }
  ProxySpec spec;
  std::string user, password;
  bool has_password = false;
  std::size_t at = rest.rfind('@');
  if (at != std::string_view::npos) {
    std::string_view info = rest.substr(0, at);
    std::size_t colon = info.find(':');
    std::optional<std::string> u = PercentDecode(info.substr(0, colon));
    std::optional<std::string> p =
        colon == std::string_view::npos ? std::string() : PercentDecode(info.substr(colon + 1));
    if (!u || !p) {
      return absl::InvalidArgumentError("the proxy URL's user info has a bad percent-encoding");
    }
    user = *u;
    password = *p;
    has_password = colon != std::string_view::npos;
    rest = rest.substr(at + 1);
  }
  auto host_port = HostPort(rest);
  if (!host_port) {
    return absl::InvalidArgumentError("the proxy URL needs host[:port]");
  }
  for (char c : host_port->first) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != ':' &&
        c != '_') {
      return absl::InvalidArgumentError("the proxy URL's host has a character hosts cannot have");
    }
  }
  spec.host = host_port->first;
  spec.port = host_port->second.value_or(80);
  if (!user.empty() || has_password) spec.authorization = "Basic " + Base64(user + ":" + password);
  std::string host_text =
      spec.host.find(':') != std::string::npos ? "[" + spec.host + "]" : spec.host;
  spec.display = fmt::format(
      "http://{}{}:{}", user.empty() && !has_password ? "" : user + (has_password ? ":***@" : "@"),
      host_text, spec.port);
  return spec;
}

bool NoProxyMatches(std::string_view no_proxy, std::string_view host_in, uint16_t port) {
  std::string host = Lower(host_in);
  if (host.starts_with('[') && host.ends_with(']')) host = host.substr(1, host.size() - 2);
  while (host.ends_with('.')) host.pop_back();
  std::string_view list = no_proxy;
  while (!list.empty()) {
    std::size_t comma = list.find(',');
    std::string_view entry = Trim(list.substr(0, comma));
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    if (entry.empty()) continue;
    if (entry == "*") return true;
    if (entry.find('/') != std::string_view::npos) {
      if (InCidr(entry, host)) return true;
      continue;
    }
    auto parsed = HostPort(entry);
    if (!parsed) continue;
    auto [name, entry_port] = *parsed;
    if (entry_port && *entry_port != port) continue;
    while (name.starts_with('.') || name.starts_with("*."))
      name = name.substr(name[0] == '*' ? 2 : 1);
    while (name.ends_with('.')) name.pop_back();
    if (name.empty()) continue;
    if (IpBytes(name) || IpBytes(host)) {
      std::optional<std::string> a = IpBytes(name), b = IpBytes(host);
      if (a && b && *a == *b) return true;
      continue;
    }
    if (host == name || (host.size() > name.size() && host.ends_with(name) &&
                         host[host.size() - name.size() - 1] == '.')) {
      return true;
    }
  }
  return false;
}

std::optional<std::string> ProcessEnv(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

absl::StatusOr<std::optional<ProxySpec>> ProxyFor(std::string_view host, uint16_t port,
                                                  const EnvLookup& env) {
  const char* variable = "https_proxy";
  std::optional<std::string> proxy = env("https_proxy");
  if (!proxy || proxy->empty()) {
    variable = "HTTPS_PROXY";
    proxy = env("HTTPS_PROXY");
  }
  if (!proxy || Trim(*proxy).empty()) return std::optional<ProxySpec>();
  std::optional<std::string> no_proxy = env("no_proxy");
  if (!no_proxy || no_proxy->empty()) no_proxy = env("NO_PROXY");
  if (no_proxy && NoProxyMatches(*no_proxy, host, port)) return std::optional<ProxySpec>();
  absl::StatusOr<ProxySpec> spec = ParseProxyUrl(*proxy);
  if (!spec.ok()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: {}", variable, ToStd(spec.status().message())));
  }
  return std::optional<ProxySpec>(*std::move(spec));
}

}  // namespace bcd::transport
