#pragma once

// config.toml: read with toml++ into a typed, validated Config.
//
// Parsing is pure (text in, Config or error out); Load adds reading the file. Every error names the
// file, the line (where the key has one) and the dotted key, in the form
//   /etc/bcd/config.toml:3: gateway_url: expected an https:// URL, got "http://gw"
// Unknown keys, wrong types and out-of-range values are errors, never ignored.

#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "base/log.h"

namespace bcd {

inline constexpr std::string_view kDefaultConfigPath = "/etc/bcd/config.toml";
inline constexpr std::string_view kDefaultStateDir = "/var/lib/bcd";
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

class Config {
 public:
  // The embedded default: what commands that do not dial use when no config file exists.
  static Config EmbeddedDefault();
  // Parses `text`; `source` names it in errors (normally the file path).
  static absl::StatusOr<Config> Parse(std::string_view text, std::string_view source);
  // Reads and parses the file at `path`.
  static absl::StatusOr<Config> Load(const std::filesystem::path& path);

  // Set in every parsed config; absent only in the embedded default.
  const std::optional<Url>& gateway_url() const { return gateway_url_; }
  // The name the gateway certificate must carry: gateway_server_name, else the URL's host.
  std::string GatewayServerName() const;
  const std::optional<Sha256Pin>& gateway_ca_spki_sha256() const { return gateway_ca_pin_; }
  const std::optional<Sha256Pin>& join_service_key_sha256() const { return join_service_pin_; }
  const std::filesystem::path& state_dir() const { return state_dir_; }
  LogLevel log_level() const { return log_level_; }
  const std::optional<WebSocketConfig>& websocket() const { return websocket_; }
  const std::vector<ReleaseKey>& release_keys() const { return release_keys_; }
  const std::optional<ListenAddress>& imds_listen() const { return imds_listen_; }
  // [node]: what node.reboot runs (after reporting), and the journal unit holding bcd's own log
  // (logs.collect).
  const std::vector<std::string>& reboot_command() const { return reboot_command_; }
  const std::string& log_unit() const { return log_unit_; }
  uint32_t max_tunnels() const { return max_tunnels_; }
  // [tunnels] user: whom `shell` tunnels log in as ("" = the user bcd runs as); allow: where `tcp`
  // tunnels may go (default: loopback only).
  const std::string& tunnel_user() const { return tunnel_user_; }
  const std::vector<TunnelAllowRule>& tunnel_allow() const { return tunnel_allow_; }
  const std::string& source() const { return source_; }

 private:
  friend class ConfigParser;
  Config() = default;

  std::string source_ = "(embedded default)";
  std::optional<Url> gateway_url_;
  std::optional<std::string> gateway_server_name_;
  std::optional<Sha256Pin> gateway_ca_pin_;
  std::optional<Sha256Pin> join_service_pin_;
  std::filesystem::path state_dir_{kDefaultStateDir};
  LogLevel log_level_ = LogLevel::kInfo;
  std::optional<WebSocketConfig> websocket_;
  std::vector<ReleaseKey> release_keys_;
  std::optional<ListenAddress> imds_listen_;
  std::vector<std::string> reboot_command_{"systemctl", "reboot"};
  std::string log_unit_ = "bcd.service";
  uint32_t max_tunnels_ = kMaxTunnels;
  std::string tunnel_user_;
  // Loopback by address only: a name is decided by what it resolves to, and "localhost" resolves
  // to these.
  std::vector<TunnelAllowRule> tunnel_allow_ = {*TunnelAllowRule::Parse("127.0.0.0/8:*"),
                                                *TunnelAllowRule::Parse("[::1]:*")};
};

}  // namespace bcd
