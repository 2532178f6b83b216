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
#include "config/values.h"

namespace bcd {

inline constexpr std::string_view kDefaultConfigPath = "/etc/bcd/config.toml";
inline constexpr std::string_view kDefaultStateDir = "/var/lib/bcd";

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
  LogFormat log_format() const { return log_format_; }
  const std::optional<WebSocketConfig>& websocket() const { return websocket_; }
  const std::vector<ReleaseKey>& release_keys() const { return release_keys_; }
  // [update] beyond the keys: how long a new version has to be welcomed, the most a release may
  // weigh, and the room a download must leave on the binary's filesystem.
  struct Update {
    int64_t trial_seconds = 120;
    int64_t max_bytes = int64_t{512} << 20;
    int64_t keep_free_bytes = int64_t{64} << 20;
  };
  const Update& update() const { return update_; }
  const std::optional<ListenAddress>& imds_listen() const { return imds_listen_; }
  // [diag] listen: where /metrics, /healthz and /readyz are served; unset (the default) serves
  // none.
  const std::optional<ListenAddress>& diag_listen() const { return diag_listen_; }
  // [node]: what node.reboot runs (after reporting), and the journal unit holding bcd's own log
  // (logs.collect).
  const std::vector<std::string>& reboot_command() const { return reboot_command_; }
  const std::string& log_unit() const { return log_unit_; }
  uint32_t max_tunnels() const { return max_tunnels_; }
  // [tunnels] user: whom `shell` tunnels log in as ("" = the user bcd runs as); allow: where `tcp`
  // tunnels may go (default: loopback only).
  const std::string& tunnel_user() const { return tunnel_user_; }
  const std::vector<TunnelAllowRule>& tunnel_allow() const { return tunnel_allow_; }
  // [site]: how the site agent reaches its BMCs. A Redfish certificate that the command pins
  // no key for must chain to bmc_ca_file, or the BMC's address must be listed in
  // bmc_tls_unverified (no check at all, asked for by name); the ports are the site's.
  struct Site {
    std::string bmc_ca_file;
    std::vector<std::string> bmc_tls_unverified;
    uint16_t bmc_redfish_port = 443;
    uint16_t bmc_ipmi_port = 623;
    // site.httpProxy: the destinations it may reach (IP or CIDR and port, decided on the
    // addresses a name resolves to; none by default) and more roots for https.
    std::vector<TunnelAllowRule> http_proxy_allow;
    std::string http_proxy_ca_file;
  };
  const Site& site() const { return site_; }
  // [boot] (site mode): where the boot server listens, and the base URL booting machines reach it
  // at (what iPXE scripts and the ramdisk's command line name): given, or http://<listen> when
  // listen names one address. Unset: no boot server.
  struct Boot {
    ListenAddress listen;
    std::string url;  // "http://host:port", no trailing slash
  };
  const std::optional<Boot>& boot() const { return boot_; }
  const std::string& source() const { return source_; }
  // The tables the file holds ("websocket", "imds", ...), in file order: the engine reads some,
  // the mode others (Mode::ConfigSections), and one nobody reads is reported at start.
  const std::vector<std::string>& sections() const { return sections_; }

 private:
  friend class ConfigParser;
  Config() = default;

  std::string source_ = "(embedded default)";
  std::vector<std::string> sections_;
  std::optional<Url> gateway_url_;
  std::optional<std::string> gateway_server_name_;
  std::optional<Sha256Pin> gateway_ca_pin_;
  std::optional<Sha256Pin> join_service_pin_;
  std::filesystem::path state_dir_{kDefaultStateDir};
  LogLevel log_level_ = LogLevel::kInfo;
  LogFormat log_format_ = LogFormat::kLogfmt;
  std::optional<WebSocketConfig> websocket_;
  std::vector<ReleaseKey> release_keys_;
  Update update_;
  std::optional<ListenAddress> imds_listen_;
  std::optional<ListenAddress> diag_listen_;
  Site site_;
  std::optional<Boot> boot_;
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
