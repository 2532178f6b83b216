#include "config/config.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>

#include "absl/strings/ascii.h"
#include "base/net.h"
#include "fmt/format.h"
#include "proto/absl_compat.h"
#include "toml++/toml.h"

namespace bcd {
namespace {

std::string_view TypeName(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::table:
      return "table";
    case toml::node_type::array:
      return "array";
    case toml::node_type::string:
      return "string";
    case toml::node_type::integer:
      return "integer";
    case toml::node_type::floating_point:
      return "float";
    case toml::node_type::boolean:
      return "boolean";
    case toml::node_type::date:
      return "date";
    case toml::node_type::time:
      return "time";
    case toml::node_type::date_time:
      return "date-time";
    case toml::node_type::none:
      break;
  }
  return "nothing";
}

}  // namespace

// Walks a parsed TOML document into a Config, collecting every error.
class ConfigParser {
 public:
  explicit ConfigParser(std::string_view source) : source_(source) {}

  absl::StatusOr<Config> Parse(std::string_view text) {
    toml::table root;
    try {
      root = toml::parse(text, source_);
    } catch (const toml::parse_error& e) {
      return absl::InvalidArgumentError(fmt::format("{}:{}:{}: invalid TOML: {}", source_,
                                                    e.source().begin.line, e.source().begin.column,
                                                    e.description()));
    }
    Config config;
    config.source_ = source_;
    std::vector<std::pair<uint32_t, std::string>> tables;  // (line, name): toml++ sorts by name
    for (const auto& [key, value] : root) {
      if (value.is_table()) tables.emplace_back(value.source().begin.line, key.str());
    }
    std::sort(tables.begin(), tables.end());
    for (auto& table : tables) config.sections_.push_back(std::move(table.second));
    Walk(
        root, "",
        {
            {"gateway_url",
             [&](const toml::node& n, const std::string& k) { GatewayUrl(n, k, &config); }},
            {"gateway_server_name",
             [&](const toml::node& n, const std::string& k) { ServerName(n, k, &config); }},
            {"gateway_ca_spki_sha256",
             [&](const toml::node& n, const std::string& k) {
               config.gateway_ca_pin_ = Pin(n, k);
             }},
            {"join_service_key_sha256",
             [&](const toml::node& n, const std::string& k) {
               config.join_service_pin_ = Pin(n, k);
             }},
            {"state_dir",
             [&](const toml::node& n, const std::string& k) {
               if (auto p = AbsolutePath(n, k)) config.state_dir_ = *p;
             }},
            {"log_level", [&](const toml::node& n, const std::string& k) { Level(n, k, &config); }},
            {"log_format",
             [&](const toml::node& n, const std::string& k) { LogFormat(n, k, &config); }},
            {"websocket",
             [&](const toml::node& n, const std::string& k) { WebSocket(n, k, &config); }},
            {"update", [&](const toml::node& n, const std::string& k) { Update(n, k, &config); }},
            {"imds", [&](const toml::node& n, const std::string& k) { Imds(n, k, &config); }},
            {"diag", [&](const toml::node& n, const std::string& k) { Diag(n, k, &config); }},
            {"tunnels", [&](const toml::node& n, const std::string& k) { Tunnels(n, k, &config); }},
            {"node", [&](const toml::node& n, const std::string& k) { Node(n, k, &config); }},
            {"site", [&](const toml::node& n, const std::string& k) { Site(n, k, &config); }},
            {"boot", [&](const toml::node& n, const std::string& k) { Boot(n, k, &config); }},
        });
    return Finish(std::move(config));
  }

 private:
  using Handler = std::function<void(const toml::node&, const std::string&)>;

  void GatewayUrl(const toml::node& n, const std::string& k, Config* config) {
    std::optional<std::string> s = String(n, k);
    if (!s) return;
    if (auto url = Url::Parse(*s, {"https"}); !url.ok()) {
      Error(n, k, ToStd(url.status().message()));
    } else if (!url->path().empty() && url->path() != "/") {
      Error(n, k, fmt::format("a path is not allowed in the gateway URL, got \"{}\"", *s));
    } else {
      config->gateway_url_ = *url;
      gateway_url_node_ = &n;
    }
  }

  void ServerName(const toml::node& n, const std::string& k, Config* config) {
    std::optional<std::string> s = String(n, k);
    if (!s) return;
    if (!IsDnsName(*s)) {
      Error(n, k, fmt::format("expected a DNS name, got \"{}\"", *s));
    } else {
      config->gateway_server_name_ = absl::AsciiStrToLower(ToAbsl(*s));
    }
  }

  void Level(const toml::node& n, const std::string& k, Config* config) {
    std::optional<std::string> s = String(n, k);
    if (!s) return;
    for (LogLevel level : {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarn, LogLevel::kError}) {
      if (*s == LogLevelName(level)) {
        config->log_level_ = level;
        return;
      }
    }
    Error(n, k, fmt::format("expected one of debug, info, warn, error, got \"{}\"", *s));
  }

  // What no single key can say (required keys, keys that need each other), then every error
  // found, in one message.
  absl::StatusOr<Config> Finish(Config config) {
    if (!config.gateway_url_ && !seen_.contains("gateway_url")) Missing("gateway_url");
    if (!config.gateway_ca_pin_ && !seen_.contains("gateway_ca_spki_sha256")) {
      Missing("gateway_ca_spki_sha256");
    }
    if (config.gateway_url_ && config.gateway_url_->host_is_ip() && !config.gateway_server_name_ &&
        !seen_.contains("gateway_server_name")) {
      Error(*gateway_url_node_, "gateway_server_name",
            "required when gateway_url names an IP address: the name the gateway certificate "
            "must carry");
    }
    if (!errors_.empty()) {
      std::string message;
      for (const auto& [line, error] : errors_) {
        if (!message.empty()) message += "\n";
        message += error;
      }
      return absl::InvalidArgumentError(message);
    }
    return config;
  }

  void Error(const toml::node& node, std::string_view key, std::string_view message) {
    Add(node.source().begin.line,
        fmt::format("{}:{}: {}: {}", source_, node.source().begin.line, key, message));
  }

  void Missing(std::string_view key) {
    Add(0, fmt::format("{}: {}: required key is missing", source_, key));
  }

  // toml++ iterates keys in sorted order; errors are reported in file order, missing keys last.
  void Add(uint32_t line, std::string message) {
    auto at = std::upper_bound(errors_.begin(), errors_.end(), line, [](uint32_t l, const auto& e) {
      return l != 0 && (e.first == 0 || l < e.first);
    });
    errors_.insert(at, {line, std::move(message)});
  }

  // Calls the handler of each key in `table`; unknown keys are errors.
  void Walk(const toml::table& table, std::string_view prefix,
            std::initializer_list<std::pair<std::string_view, Handler>> handlers) {
    for (auto&& [key, node] : table) {
      std::string_view name = key.str();
      std::string dotted = prefix.empty() ? std::string(name) : fmt::format("{}.{}", prefix, name);
      seen_.insert(dotted);
      auto it = std::find_if(handlers.begin(), handlers.end(),
                             [name](const auto& h) { return h.first == name; });
      if (it == handlers.end()) {
        Add(key.source().begin.line,
            fmt::format("{}:{}: {}: unknown key", source_, key.source().begin.line, dotted));
        continue;
      }
      it->second(node, dotted);
    }
  }

  const toml::table* Table(const toml::node& node, const std::string& key) {
    if (const toml::table* table = node.as_table()) return table;
    Error(node, key, fmt::format("expected a table, got {}", TypeName(node)));
    return nullptr;
  }

  std::optional<std::string> String(const toml::node& node, const std::string& key) {
    if (const auto* value = node.as_string()) return value->get();
    Error(node, key, fmt::format("expected a string, got {}", TypeName(node)));
    return std::nullopt;
  }

  std::optional<Sha256Pin> Pin(const toml::node& node, const std::string& key) {
    std::optional<std::string> text = String(node, key);
    if (!text) return std::nullopt;
    absl::StatusOr<Sha256Pin> pin = Sha256Pin::ParseHex(*text);
    if (!pin.ok()) {
      Error(node, key, ToStd(pin.status().message()));
      return std::nullopt;
    }
    return *pin;
  }

  std::optional<std::filesystem::path> AbsolutePath(const toml::node& node,
                                                    const std::string& key) {
    std::optional<std::string> text = String(node, key);
    if (!text) return std::nullopt;
    if (text->empty() || text->front() != '/' || text->find('\0') != std::string::npos) {
      Error(node, key, fmt::format("expected an absolute path, got \"{}\"", *text));
      return std::nullopt;
    }
    return std::filesystem::path(*text);
  }

  void WebSocket(const toml::node& node, const std::string& key, Config* config) {
    const toml::table* table = Table(node, key);
    if (!table) return;
    std::optional<Url> url;
    std::optional<std::filesystem::path> proxy_ca_file;
    Walk(*table, key,
         {
             {"url",
              [&](const toml::node& n, const std::string& k) {
                if (auto s = String(n, k)) {
                  absl::StatusOr<Url> parsed = Url::Parse(*s, {"wss"});
                  if (parsed.ok()) {
                    url = *parsed;
                  } else {
                    Error(n, k, ToStd(parsed.status().message()));
                  }
                }
              }},
             {"proxy_ca_file", [&](const toml::node& n,
                                   const std::string& k) { proxy_ca_file = AbsolutePath(n, k); }},
         });
    if (url) {
      config->websocket_ = WebSocketConfig{*url, proxy_ca_file};
    } else if (!seen_.contains(key + ".url")) {
      Error(node, key + ".url", "required key is missing: the [websocket] section needs a url");
    }
  }

  void Update(const toml::node& node, const std::string& key, Config* config) {
    const toml::table* table = Table(node, key);
    if (!table) return;
    Walk(*table, key,
         {
             {"release_keys",
              [&](const toml::node& n, const std::string& k) {
                const toml::array* array = n.as_array();
                if (!array) {
                  Error(n, k, fmt::format("expected an array of strings, got {}", TypeName(n)));
                  return;
                }
                for (std::size_t i = 0; i < array->size(); ++i) {
                  const toml::node& item = *array->get(i);
                  std::string item_key = fmt::format("{}[{}]", k, i);
                  std::optional<std::string> text = String(item, item_key);
                  if (!text) continue;
                  if (absl::StatusOr<Sha256Pin> pin = Sha256Pin::ParseHex(*text); pin.ok()) {
                    config->release_keys_.emplace_back(*pin);
                  } else if (!text->empty() && text->front() == '/') {
                    config->release_keys_.emplace_back(std::filesystem::path(*text));
                  } else {
                    Error(item, item_key,
                          fmt::format(
                              "expected an SPKI sha256 (64 hex characters) or an absolute path "
                              "to a PEM file, got \"{}\"",
                              *text));
                  }
                }
              }},
             {"trial_seconds",
              [&](const toml::node& n, const std::string& k) {
                if (auto v = Bounded(n, k, 5, 3600)) config->update_.trial_seconds = *v;
              }},
             {"max_bytes",
              [&](const toml::node& n, const std::string& k) {
                if (auto v = Bounded(n, k, 1 << 20, int64_t{1} << 32))
                  config->update_.max_bytes = *v;
              }},
             {"keep_free_bytes",
              [&](const toml::node& n, const std::string& k) {
                if (auto v = Bounded(n, k, 0, int64_t{1} << 40))
                  config->update_.keep_free_bytes = *v;
              }},
         });
  }

  // An integer in [min, max], or an error saying so.
  std::optional<int64_t> Bounded(const toml::node& n, const std::string& k, int64_t min,
                                 int64_t max) {
    const auto* value = n.as_integer();
    if (!value) {
      Error(n, k, fmt::format("expected an integer, got {}", TypeName(n)));
    } else if (value->get() < min || value->get() > max) {
      Error(n, k, fmt::format("expected {} to {}, got {}", min, max, value->get()));
    } else {
      return value->get();
    }
    return std::nullopt;
  }

  // "IP:PORT": an IPv4 address or a bracketed IPv6 one, and a port (0, any free one, when
  // `any_port`: the port taken is logged).
  std::optional<ListenAddress> Listen(const toml::node& n, const std::string& k,
                                      bool any_port = false) {
    std::optional<std::string> text = String(n, k);
    if (!text) return std::nullopt;
    auto host_port = SplitHostPort(*text);
    std::optional<uint16_t> port = host_port ? ParsePort(host_port->second) : std::nullopt;
    if (any_port && host_port && host_port->second == "0") port = 0;
    bool bracketed = text->starts_with('[');
    if (!host_port || !port || !(bracketed ? IsIpv6(host_port->first) : IsIpv4(host_port->first))) {
      Error(n, k,
            fmt::format("expected IP:PORT (an IPv4 address or a bracketed IPv6 "
                        "address, and a port from 1 to 65535), got \"{}\"",
                        *text));
      return std::nullopt;
    }
    return ListenAddress{host_port->first, *port};
  }

  void Imds(const toml::node& node, const std::string& key, Config* config) {
    const toml::table* table = Table(node, key);
    if (!table) return;
    Walk(*table, key,
         {
             {"listen", [&](const toml::node& n,
                            const std::string& k) { config->imds_listen_ = Listen(n, k); }},
         });
  }

  // [diag]: listen is required; an address other than loopback needs allow_remote = true, since
  // what /metrics and /readyz say is for this machine's operators.
  void Diag(const toml::node& node, const std::string& key, Config* config) {
    const toml::table* table = Table(node, key);
    if (!table) return;
    std::optional<ListenAddress> listen;
    const toml::node* listen_node = nullptr;
    bool allow_remote = false;
    Walk(*table, key,
         {
             {"listen",
              [&](const toml::node& n, const std::string& k) {
                listen = Listen(n, k, /*any_port=*/true);
                listen_node = &n;
              }},
             {"allow_remote",
              [&](const toml::node& n, const std::string& k) {
                if (const auto* value = n.as_boolean()) {
                  allow_remote = value->get();
                } else {
                  Error(n, k, fmt::format("expected true or false, got {}", TypeName(n)));
                }
              }},
         });
    if (!listen) {
      if (!seen_.contains(key + ".listen")) {
        Error(node, key + ".listen", "required key is missing: the [diag] section needs a listen");
      }
      return;
    }
    bool loopback = listen->host == "::1" || listen->host.starts_with("127.");
    if (!loopback && !allow_remote) {
      Error(*listen_node, key + ".listen",
            fmt::format("{} is not a loopback address: set allow_remote = true to serve "
                        "/metrics, /healthz and /readyz beyond this machine",
                        listen->host));
      return;
    }
    config->diag_listen_ = listen;
  }

  void LogFormat(const toml::node& n, const std::string& k, Config* config) {
    std::optional<std::string> s = String(n, k);
    if (!s) return;
    if (*s == "logfmt") {
      config->log_format_ = LogFormat::kLogfmt;
    } else if (*s == "json") {
      config->log_format_ = LogFormat::kJson;
    } else {
      Error(n, k, fmt::format("expected logfmt or json, got \"{}\"", *s));
    }
  }

  void Tunnels(const toml::node& node, const std::string& key, Config* config) {
    const toml::table* table = Table(node, key);
    if (!table) return;
    Walk(*table, key,
         {
             {"max",
              [&](const toml::node& n, const std::string& k) {
                const auto* value = n.as_integer();
                if (!value) {
                  Error(n, k, fmt::format("expected an integer, got {}", TypeName(n)));
                } else if (value->get() < 1 || value->get() > kMaxTunnels) {
                  Error(n, k, fmt::format("expected 1 to {}, got {}", kMaxTunnels, value->get()));
                } else {
                  config->max_tunnels_ = static_cast<uint32_t>(value->get());
                }
              }},
             {"user",
              [&](const toml::node& n, const std::string& k) {
                if (auto s = String(n, k)) {
                  bool ok = !s->empty() && s->size() <= 32 && (*s)[0] != '-';
                  for (char c : *s) {
                    ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' ||
                                c == '-' || c == '.');
                  }
                  if (!ok) {
                    Error(n, k, fmt::format("expected a user name, got \"{}\"", *s));
                  } else {
                    config->tunnel_user_ = *s;
                  }
                }
              }},
             {"allow",
              [&](const toml::node& n, const std::string& k) {
                const toml::array* array = n.as_array();
                if (!array) {
                  Error(n, k,
                        fmt::format("expected an array of \"HOST:PORT\" strings, got {}",
                                    TypeName(n)));
                  return;
                }
                std::vector<TunnelAllowRule> rules;
                for (std::size_t i = 0; i < array->size(); ++i) {
                  std::string item_key = fmt::format("{}[{}]", k, i);
                  std::optional<std::string> text = String(*array->get(i), item_key);
                  if (!text) return;
                  absl::StatusOr<TunnelAllowRule> rule = TunnelAllowRule::Parse(*text);
                  if (!rule.ok()) {
                    Error(*array->get(i), item_key, ToStd(rule.status().message()));
                    return;
                  }
                  rules.push_back(*std::move(rule));
                }
                config->tunnel_allow_ = std::move(rules);
              }},
         });
  }

  void Site(const toml::node& node, const std::string& key, Config* config) {
    const toml::table* table = Table(node, key);
    if (!table) return;
    Walk(*table, key,
         {
             {"bmc_ca_file",
              [&](const toml::node& n, const std::string& k) {
                if (auto p = AbsolutePath(n, k)) config->site_.bmc_ca_file = p->string();
              }},
             {"bmc_tls_unverified",
              [&](const toml::node& n, const std::string& k) {
                const toml::array* array = n.as_array();
                if (!array) {
                  Error(n, k,
                        fmt::format("expected an array of BMC addresses, got {}", TypeName(n)));
                  return;
                }
                std::vector<std::string> addresses;
                for (std::size_t i = 0; i < array->size(); ++i) {
                  std::string item_key = fmt::format("{}[{}]", k, i);
                  std::optional<std::string> text = String(*array->get(i), item_key);
                  if (!text) return;
                  if (text->empty() || text->size() > 255 ||
                      text->find_first_of(" \t\r\n/") != std::string::npos) {
                    Error(*array->get(i), item_key,
                          fmt::format("expected a BMC address, got \"{}\"", *text));
                    return;
                  }
                  addresses.push_back(*text);
                }
                config->site_.bmc_tls_unverified = std::move(addresses);
              }},
             {"bmc_redfish_port",
              [&](const toml::node& n, const std::string& k) {
                if (auto v = Bounded(n, k, 1, 65535))
                  config->site_.bmc_redfish_port = static_cast<uint16_t>(*v);
              }},
             {"bmc_ipmi_port",
              [&](const toml::node& n, const std::string& k) {
                if (auto v = Bounded(n, k, 1, 65535))
                  config->site_.bmc_ipmi_port = static_cast<uint16_t>(*v);
              }},
             {"http_proxy_ca_file",
              [&](const toml::node& n, const std::string& k) {
                if (auto p = AbsolutePath(n, k)) config->site_.http_proxy_ca_file = p->string();
              }},
             {"http_proxy_allow",
              [&](const toml::node& n, const std::string& k) {
                const toml::array* array = n.as_array();
                if (!array) {
                  Error(n, k,
                        fmt::format("expected an array of \"CIDR:PORT\" strings, got {}",
                                    TypeName(n)));
                  return;
                }
                std::vector<TunnelAllowRule> rules;
                for (std::size_t i = 0; i < array->size(); ++i) {
                  std::string item_key = fmt::format("{}[{}]", k, i);
                  std::optional<std::string> text = String(*array->get(i), item_key);
                  if (!text) return;
                  absl::StatusOr<TunnelAllowRule> rule = TunnelAllowRule::Parse(*text);
                  if (!rule.ok()) {
                    Error(*array->get(i), item_key, ToStd(rule.status().message()));
                    return;
                  }
                  if (rule->is_name) {
                    Error(*array->get(i), item_key,
                          fmt::format("expected an IP or CIDR block and a port: a name is decided "
                                      "by the addresses it resolves to, got \"{}\"",
                                      *text));
                    return;
                  }
                  rules.push_back(*std::move(rule));
                }
                config->site_.http_proxy_allow = std::move(rules);
              }},
         });
  }

  // [boot]: listen is required; url is required when listen is a wildcard address (a booting
  // machine needs one address to come back to), and must be plain http (iPXE in NIC ROMs speaks no
  // HTTPS) without a path.
  void Boot(const toml::node& node, const std::string& key, Config* config) {
    const toml::table* table = Table(node, key);
    if (!table) return;
    std::optional<ListenAddress> listen;
    std::optional<std::string> url;
    Walk(*table, key,
         {
             {"listen", [&](const toml::node& n,
                            const std::string& k) { listen = Listen(n, k, /*any_port=*/true); }},
             {"url",
              [&](const toml::node& n, const std::string& k) {
                std::optional<std::string> s = String(n, k);
                if (!s) return;
                absl::StatusOr<Url> parsed = Url::Parse(*s, {"http"});
                if (!parsed.ok()) {
                  Error(n, k, ToStd(parsed.status().message()));
                } else if (!parsed->path().empty() && parsed->path() != "/") {
                  Error(n, k, fmt::format("a path is not allowed in the boot URL, got \"{}\"", *s));
                } else {
                  url = *s;
                  while (url->ends_with('/')) url->pop_back();
                }
              }},
         });
    if (!listen) {
      if (!seen_.contains(key + ".listen")) {
        Error(node, key + ".listen", "required key is missing: the [boot] section needs a listen");
      }
      return;
    }
    if (!url) {
      if (listen->host == "0.0.0.0" || listen->host == "::" || listen->port == 0) {
        if (!seen_.contains(key + ".url")) {
          Error(node, key + ".url",
                fmt::format("required when listen is {}: the address booting machines reach the "
                            "boot server at, like \"http://10.20.0.5:{}\"",
                            listen->port == 0 ? "port 0" : "a wildcard address",
                            listen->port == 0 ? 8080 : listen->port));
        }
        return;
      }
      bool v6 = listen->host.find(':') != std::string::npos;
      url =
          fmt::format("http://{}{}{}:{}", v6 ? "[" : "", listen->host, v6 ? "]" : "", listen->port);
    }
    config->boot_ = Config::Boot{.listen = *listen, .url = *url};
  }

  void Node(const toml::node& node, const std::string& key, Config* config) {
    const toml::table* table = Table(node, key);
    if (!table) return;
    Walk(*table, key,
         {
             {"reboot_command",
              [&](const toml::node& n, const std::string& k) {
                const toml::array* array = n.as_array();
                if (!array || array->empty()) {
                  Error(n, k,
                        fmt::format("expected a non-empty array of strings (the program and its "
                                    "arguments), got {}",
                                    array ? "an empty array" : TypeName(n)));
                  return;
                }
                std::vector<std::string> argv;
                for (std::size_t i = 0; i < array->size(); ++i) {
                  std::string item_key = fmt::format("{}[{}]", k, i);
                  std::optional<std::string> text = String(*array->get(i), item_key);
                  if (!text) return;
                  if (text->empty()) {
                    Error(*array->get(i), item_key, "expected a non-empty string");
                    return;
                  }
                  argv.push_back(*text);
                }
                config->reboot_command_ = std::move(argv);
              }},
             {"log_unit",
              [&](const toml::node& n, const std::string& k) {
                if (auto s = String(n, k)) {
                  if (!IsUnitName(*s)) {
                    Error(n, k, fmt::format("expected a systemd unit name, got \"{}\"", *s));
                  } else {
                    config->log_unit_ = *s;
                  }
                }
              }},
         });
  }

  std::string source_;
  std::vector<std::pair<uint32_t, std::string>> errors_;  // (line, message), 0 = no line
  std::set<std::string, std::less<>> seen_;
  const toml::node* gateway_url_node_ = nullptr;
};

Config Config::EmbeddedDefault() { return Config(); }

absl::StatusOr<Config> Config::Parse(std::string_view text, std::string_view source) {
  return ConfigParser(source).Parse(text);
}

absl::StatusOr<Config> Config::Load(const std::filesystem::path& path) {
  constexpr std::size_t kMaxConfigBytes = 1 << 20;
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return absl::NotFoundError(
        fmt::format("{}: cannot read the config file: {}", path.string(), std::strerror(errno)));
  }
  std::string text(kMaxConfigBytes + 1, '\0');
  file.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (file.bad()) {
    return absl::DataLossError(
        fmt::format("{}: cannot read the config file: {}", path.string(), std::strerror(errno)));
  }
  text.resize(static_cast<std::size_t>(file.gcount()));
  if (text.size() > kMaxConfigBytes) {
    return absl::InvalidArgumentError(
        fmt::format("{}: the config file is larger than {} bytes", path.string(), kMaxConfigBytes));
  }
  return Parse(text, path.string());
}

std::string Config::GatewayServerName() const {
  if (gateway_server_name_) return *gateway_server_name_;
  return gateway_url_ ? gateway_url_->host() : std::string();
}

}  // namespace bcd
