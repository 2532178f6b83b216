#include "config/values.h"

#include <algorithm>
#include <cctype>
#include <charconv>

#include "absl/strings/ascii.h"
#include "base/net.h"
#include "fmt/format.h"
#include "proto/absl_compat.h"

namespace bcd {

absl::StatusOr<TunnelAllowRule> TunnelAllowRule::Parse(std::string_view text) {
  std::size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(
        fmt::format("expected HOST:PORT (PORT a number or *), got \"{}\"", text));
  }
  std::string_view host = text.substr(0, colon), port = text.substr(colon + 1);
  TunnelAllowRule rule;
  rule.text = std::string(text);
  if (port != "*") {
    rule.port = ParsePort(port);
    if (!rule.port) {
      return absl::InvalidArgumentError(
          fmt::format("\"{}\": the port must be 1 to 65535 or *", text));
    }
  }
  if (host.starts_with('[') && host.ends_with(']')) host = host.substr(1, host.size() - 2);
  std::string_view address = host.substr(0, host.find('/'));
  if (IpBytes(address)) {
    if (host.find('/') != std::string_view::npos && !InCidr(host, address)) {
      return absl::InvalidArgumentError(fmt::format("\"{}\": a bad CIDR block", text));
    }
    rule.host = std::string(host);
    return rule;
  }
  for (char c : host) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-') {
      return absl::InvalidArgumentError(
          fmt::format("\"{}\": HOST must be an IP, a CIDR block or a host name", text));
    }
  }
  rule.host = absl::AsciiStrToLower(ToAbsl(host));
  rule.is_name = true;
  return rule;
}

bool TunnelAllowRule::Allows(std::string_view host, std::string_view address, uint16_t port) const {
  if (this->port && *this->port != port) return false;
  if (is_name) return absl::AsciiStrToLower(ToAbsl(host)) == this->host;
  return InCidr(this->host, address);
}

absl::StatusOr<Url> Url::Parse(std::string_view text,
                               std::initializer_list<std::string_view> schemes, bool allow_query) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(fmt::format("{}, got \"{}\"", why, text));
  };
  std::string expected = "expected a URL with scheme";
  for (std::string_view scheme : schemes) expected += fmt::format(" {}://", scheme);
  std::size_t sep = text.find("://");
  if (sep == std::string_view::npos) return bad(expected);
  Url url;
  url.text_ = std::string(text);
  url.scheme_ = absl::AsciiStrToLower(ToAbsl(text.substr(0, sep)));
  if (std::find(schemes.begin(), schemes.end(), url.scheme_) == schemes.end()) return bad(expected);
  if (url.scheme_ == "http") url.port_ = 80;
  std::string_view rest = text.substr(sep + 3);
  if (rest.find('#') != std::string_view::npos) return bad("a fragment is not allowed in the URL");
  if (std::size_t q = rest.find('?'); q != std::string_view::npos) {
    if (!allow_query) return bad("a query or fragment is not allowed in the URL");
    url.query_ = std::string(rest.substr(q + 1));
    rest = rest.substr(0, q);
  }
  for (char c : rest) {
    if (static_cast<unsigned char>(c) <= 0x20 || static_cast<unsigned char>(c) >= 0x7f) {
      return bad("the URL has a space or a non-ASCII character");
    }
  }
  std::size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  url.path_ = slash == std::string_view::npos ? "" : std::string(rest.substr(slash));
  if (authority.find('@') != std::string_view::npos)
    return bad("user info is not allowed in the URL");
  auto host_port = SplitHostPort(authority);
  if (!host_port) return bad("the URL's host is malformed");
  auto& [host, port] = *host_port;
  if (!port.empty() || authority.ends_with(':')) {
    std::optional<uint16_t> parsed = ParsePort(port);
    if (!parsed) return bad("the URL's port is not a number from 1 to 65535");
    url.port_ = *parsed;
  }
  if (authority.starts_with('[')) {
    if (!IsIpv6(host)) return bad("the URL's bracketed host is not an IPv6 address");
    url.host_is_ip_ = true;
  } else if (IsIpv4(host)) {
    url.host_is_ip_ = true;
  } else if (!IsDnsName(host)) {
    return bad("the URL's host is not a DNS name or IP address");
  }
  url.host_ = absl::AsciiStrToLower(ToAbsl(host));
  return url;
}

absl::StatusOr<Sha256Pin> Sha256Pin::ParseHex(std::string_view hex) {
  if (hex.size() != 64) {
    return absl::InvalidArgumentError(
        fmt::format("expected 64 hex characters (a sha256), got {} characters", hex.size()));
  }
  Sha256Pin pin;
  for (std::size_t i = 0; i < 32; ++i) {
    auto [end, ec] = std::from_chars(hex.data() + 2 * i, hex.data() + 2 * i + 2, pin.bytes_[i], 16);
    if (ec != std::errc() || end != hex.data() + 2 * i + 2) {
      return absl::InvalidArgumentError(
          fmt::format("expected 64 hex characters (a sha256), found \"{}\" at position {}",
                      hex.substr(2 * i, 2), 2 * i));
    }
  }
  return pin;
}

std::string Sha256Pin::Hex() const {
  std::string out;
  for (uint8_t b : bytes_) out += fmt::format("{:02x}", b);
  return out;
}

bool IsUnitName(std::string_view name) {
  if (name.empty() || name.size() > 255 || name.front() == '-') return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) &&
        std::string_view(":-_.\\@").find(c) == std::string_view::npos) {
      return false;
    }
  }
  return true;
}

}  // namespace bcd
