#include "config/config.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>

#include "base/net.h"
#include "fmt/format.h"
#include "proto/absl_compat.h"
#include "toml++/toml.h"

namespace bcd {
namespace {

bool IsIpv4(const std::string& text) {
  in_addr addr{};
  return inet_pton(AF_INET, text.c_str(), &addr) == 1;
}

bool IsIpv6(const std::string& text) {
  in6_addr addr{};
  return inet_pton(AF_INET6, text.c_str(), &addr) == 1;
}

// RFC 1123 host name: dot-separated labels of letters, digits and inner hyphens.
bool IsDnsName(std::string_view name) {
  if (name.empty() || name.size() > 253) return false;
  std::size_t start = 0;
  while (start <= name.size()) {
    std::size_t dot = name.find('.', start);
    std::string_view label =
        name.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') {
      return false;
    }
    for (char c : label) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') return false;
    }
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  // An all-numeric last label would read as a (bad) IPv4 address.
  std::string_view last =
      name.substr(name.rfind('.') == std::string_view::npos ? 0 : name.rfind('.') + 1);
  return !std::all_of(last.begin(), last.end(),
                      [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
}

std::string Lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

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

// Splits "host:port" or "[v6]:port" into its parts; nullopt when malformed.
std::optional<std::pair<std::string, std::string_view>> SplitHostPort(std::string_view text) {
  if (!text.empty() && text.front() == '[') {
    std::size_t close = text.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    std::string host(text.substr(1, close - 1));
    std::string_view rest = text.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') return std::nullopt;
    return std::pair{host, rest.empty() ? rest : rest.substr(1)};
  }
  std::size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) return std::pair{std::string(text), std::string_view()};
  return std::pair{std::string(text.substr(0, colon)), text.substr(colon + 1)};
}

}  // namespace

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
  rule.host = Lower(host);
  rule.is_name = true;
  return rule;
}

bool TunnelAllowRule::Allows(std::string_view host, std::string_view address, uint16_t port) const {
  if (this->port && *this->port != port) return false;
  if (is_name) return Lower(host) == this->host;
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
  url.scheme_ = Lower(text.substr(0, sep));
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
  url.host_ = Lower(host);
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
            {"websocket",
             [&](const toml::node& n, const std::string& k) { WebSocket(n, k, &config); }},
            {"update", [&](const toml::node& n, const std::string& k) { Update(n, k, &config); }},
            {"imds", [&](const toml::node& n, const std::string& k) { Imds(n, k, &config); }},
            {"tunnels", [&](const toml::node& n, const std::string& k) { Tunnels(n, k, &config); }},
            {"node", [&](const toml::node& n, const std::string& k) { Node(n, k, &config); }},
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
      config->gateway_server_name_ = Lower(*s);
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
         });
  }

  void Imds(const toml::node& node, const std::string& key, Config* config) {
    const toml::table* table = Table(node, key);
    if (!table) return;
    Walk(*table, key,
         {
             {"listen",
              [&](const toml::node& n, const std::string& k) {
                std::optional<std::string> text = String(n, k);
                if (!text) return;
                auto host_port = SplitHostPort(*text);
                std::optional<uint16_t> port =
                    host_port ? ParsePort(host_port->second) : std::nullopt;
                bool bracketed = text->starts_with('[');
                if (!host_port || !port ||
                    !(bracketed ? IsIpv6(host_port->first) : IsIpv4(host_port->first))) {
                  Error(n, k,
                        fmt::format("expected IP:PORT (an IPv4 address or a bracketed IPv6 "
                                    "address, and a port from 1 to 65535), got \"{}\"",
                                    *text));
                  return;
                }
                config->imds_listen_ = ListenAddress{host_port->first, *port};
              }},
         });
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
