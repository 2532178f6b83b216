#pragma once

// The values a config holds, each parsed and checked on its own: URLs, sha256 pins, listen
// addresses, unit names, tunnel allow rules. The installer checks its flags with them too.

#include <array>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "absl/status/statusor.h"

namespace bcd {

inline constexpr uint32_t kMaxTunnels = 16;

// An absolute URL of the form scheme://host[:port][/path], no user info, query or fragment. The
// host is a DNS name, an IPv4 address or a bracketed IPv6 address.
class Url {
 public:
  // `schemes` lists the schemes allowed ("https", "wss", "http"); the port defaults to 80 for
  // http and 443 otherwise. A query is refused unless `allow_query` (presigned URLs carry one).
  static absl::StatusOr<Url> Parse(std::string_view text,
                                   std::initializer_list<std::string_view> schemes,
                                   bool allow_query = false);

  const std::string& scheme() const { return scheme_; }
  const std::string& host() const { return host_; }  // IPv6 without brackets
  uint16_t port() const { return port_; }
  const std::string& path() const { return path_; }    // "" or starting with '/'
  const std::string& query() const { return query_; }  // without the '?'
  // The request target: the path ("/" when empty) and the query.
  std::string target() const {
    return (path_.empty() ? "/" : path_) + (query_.empty() ? "" : "?" + query_);
  }
  bool host_is_ip() const { return host_is_ip_; }
  const std::string& text() const { return text_; }

 private:
  Url() = default;
  std::string scheme_, host_, path_, query_, text_;
  uint16_t port_ = 443;
  bool host_is_ip_ = false;
};

// A sha256 given as 64 hex characters (upper or lower case).
class Sha256Pin {
 public:
  static absl::StatusOr<Sha256Pin> ParseHex(std::string_view hex);
  const std::array<uint8_t, 32>& bytes() const { return bytes_; }
  std::string Hex() const;  // lowercase

 private:
  Sha256Pin() = default;
  std::array<uint8_t, 32> bytes_{};
};

// An IP literal and a port: "169.254.169.254:80", "[fd00::1]:80".
struct ListenAddress {
  std::string host;  // IPv6 without brackets
  uint16_t port = 0;
};

// A systemd unit name as journalctl -u takes it (letters, digits, ":-_.\@"; no leading dash).
bool IsUnitName(std::string_view name);

// Where a `tcp` tunnel may connect: "HOST:PORT", HOST an IP, a CIDR block (IPv6 in brackets) or a
// name, PORT a number or "*". A name matches the ticket's host as written; an address or block
// matches the address the host resolves to.
struct TunnelAllowRule {
  std::string host;              // lower-case name, IP or CIDR (no brackets)
  bool is_name = false;          // else an IP or CIDR block
  std::optional<uint16_t> port;  // nullopt: any
  std::string text;              // as written
  static absl::StatusOr<TunnelAllowRule> Parse(std::string_view text);
  // Whether a connection to `address` (an IP literal) for the ticket's `host` and `port` is
  // allowed.
  bool Allows(std::string_view host, std::string_view address, uint16_t port) const;
};

struct WebSocketConfig {
  Url url;
  std::optional<std::filesystem::path> proxy_ca_file;
};

// A release key: its SPKI sha256, or the path of its PEM file.
using ReleaseKey = std::variant<Sha256Pin, std::filesystem::path>;

}  // namespace bcd
