#include "install/install_script.h"

#include <algorithm>
#include <map>

#include "absl/strings/ascii.h"
#include "base/version.h"
#include "config/config.h"
#include "fmt/format.h"
#include "install/install_body.h"
#include "install/units.h"
#include "pki/keys.h"
#include "pki/x509.h"
#include "proto/absl_compat.h"

namespace bcd::install {
namespace {

std::string Message(const absl::Status& status) { return std::string(ToStd(status.message())); }

constexpr std::size_t kMaxTokenBytes = 8 * 1024;
constexpr std::size_t kMaxPemBytes = 64 * 1024;
constexpr std::size_t kMaxReleaseKeys = 8;

// A TOML basic string. Values reaching here are validated URLs, names, hex and fixed paths, but the
// escaping does not rely on it.
std::string TomlString(std::string_view value) {
  std::string out = "\"";
  for (char c : value) {
    auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\u{:04x}", u);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// One config line: literal text, with kRoot marking where the install root goes (the script's
// $root, "" for a system install).
constexpr std::string_view kRoot = "\x01";

// The printf statement that writes `line`, the root substituted at run time.
std::string PrintfLine(std::string_view line) {
  std::string format;
  int roots = 0;
  for (char c : line) {
    if (c == kRoot[0]) {
      format += "%s";
      ++roots;
    } else if (c == '%') {
      format += "%%";
    } else if (c == '\\') {
      format += "\\\\";
    } else {
      format += c;
    }
  }
  std::string statement = "  printf " + ShellQuote(format + "\\n");
  for (int i = 0; i < roots; ++i) statement += " \"$root\"";
  return statement + "\n";
}

// A fixed path under the install root, as a TOML string (the root's characters are limited to
// [A-Za-z0-9._/+-] by the script, so it needs no escaping).
std::string TomlRooted(std::string_view path) {
  return "\"" + std::string(kRoot) + std::string(path) + "\"";
}

bool IsHex64(std::string_view text) {
  return text.size() == 64 && std::all_of(text.begin(), text.end(), [](char c) {
           return std::isxdigit(static_cast<unsigned char>(c)) != 0;
         });
}

// The config lines, kRoot where the install root goes.
std::vector<std::string> ConfigLines(const InstallOptions& o) {
  std::vector<std::string> lines = {
      "# bcd " + o.role + " config, written by the bcd installer (bcd install-script).",
      "gateway_url = " + TomlString(o.gateway_url),
  };
  if (o.gateway_server_name) {
    lines.push_back("gateway_server_name = " + TomlString(*o.gateway_server_name));
  }
  lines.push_back("gateway_ca_spki_sha256 = " + TomlString(o.ca_pin));
  lines.push_back("state_dir = " + TomlRooted("/var/lib/bcd"));
  lines.push_back("log_level = \"info\"");
  if (o.websocket_url) {
    lines.push_back("");
    lines.push_back("[websocket]");
    lines.push_back("url = " + TomlString(*o.websocket_url));
    if (o.proxy_ca_pem) {
      lines.push_back("proxy_ca_file = " + TomlRooted("/etc/bcd/proxy-ca.pem"));
    }
  }
  if (!o.release_keys.empty()) {
    lines.push_back("");
    lines.push_back("[update]");
    std::string keys = "release_keys = [";
    for (std::size_t i = 0; i < o.release_keys.size(); ++i) {
      const std::string& key = o.release_keys[i];
      keys += i == 0 ? "" : ", ";
      keys += IsHex64(key) ? TomlString(key)
                           : TomlRooted(fmt::format("/etc/bcd/release-keys/{}.pem", i + 1));
    }
    lines.push_back(keys + "]");
  }
  return lines;
}

// `line` with the install root in place of kRoot.
std::string Substituted(std::string_view line, std::string_view root) {
  std::string out;
  for (char c : line) {
    if (c == kRoot[0]) {
      out += root;
    } else {
      out += c;
    }
  }
  return out;
}

// A here-document holding `text` (PEM or a unit: no line of it can be the delimiter).
absl::StatusOr<std::string> HereDoc(std::string_view text, std::string_view delimiter,
                                    std::string_view target) {
  std::string body(text);
  if (!body.empty() && body.back() != '\n') body += '\n';
  if (body.find(std::string("\n") + std::string(delimiter) + "\n") != std::string::npos ||
      body.starts_with(std::string(delimiter) + "\n")) {
    return absl::InvalidArgumentError("embedded text holds the here-document delimiter");
  }
  return "cat > " + std::string(target) + " <<'" + std::string(delimiter) + "'\n" + body +
         std::string(delimiter) + "\n";
}

}  // namespace

std::string ShellQuote(std::string_view value) {
  std::string out = "'";
  for (char c : value) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

namespace {

using ReadFile = std::function<absl::StatusOr<std::string>(const std::string&)>;

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

absl::Status SetGatewayUrl(InstallOptions& o, const std::string& value, const ReadFile&) {
  absl::StatusOr<Url> url = Url::Parse(value, {"https"});
  if (!url.ok()) return Invalid("--gateway-url: " + Message(url.status()));
  o.gateway_url = value;
  return absl::OkStatus();
}

absl::Status SetCaPin(InstallOptions& o, const std::string& value, const ReadFile&) {
  absl::StatusOr<Sha256Pin> pin = Sha256Pin::ParseHex(value);
  if (!pin.ok()) return Invalid("--ca-pin: " + Message(pin.status()));
  o.ca_pin = pin->Hex();
  return absl::OkStatus();
}

absl::Status SetToken(InstallOptions& o, const std::string& value, const ReadFile&) {
  if (value.empty() || value.size() > kMaxTokenBytes) {
    return Invalid(fmt::format("--token must be 1 to {} bytes long", kMaxTokenBytes));
  }
  for (char c : value) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) return Invalid("--token holds a control character");
  }
  o.token = value;
  return absl::OkStatus();
}

absl::Status SetRole(InstallOptions& o, const std::string& value, const ReadFile&) {
  if (value != "node" && value != "site") {
    return Invalid(fmt::format("--role must be node or site, got \"{}\"", value));
  }
  o.role = value;
  return absl::OkStatus();
}

absl::Status SetServerName(InstallOptions& o, const std::string& value, const ReadFile&) {
  o.gateway_server_name = absl::AsciiStrToLower(value);
  return absl::OkStatus();
}

absl::Status SetWebSocketUrl(InstallOptions& o, const std::string& value, const ReadFile&) {
  absl::StatusOr<Url> url = Url::Parse(value, {"wss"});
  if (!url.ok()) return Invalid("--websocket-url: " + Message(url.status()));
  o.websocket_url = value;
  return absl::OkStatus();
}

absl::Status SetProxyCaFile(InstallOptions& o, const std::string& path, const ReadFile& read_file) {
  if (!o.websocket_url) {
    return Invalid(
        "--proxy-ca-file needs --websocket-url: it is trust for the WebSocket transport only");
  }
  absl::StatusOr<std::string> pem = read_file(path);
  if (!pem.ok()) return Invalid(fmt::format("--proxy-ca-file {}: {}", path, Message(pem.status())));
  absl::StatusOr<std::vector<pki::Certificate>> certs = pki::ParsePemChain(*pem);
  if (pem->size() > kMaxPemBytes || !certs.ok() || certs->empty()) {
    return Invalid(fmt::format("--proxy-ca-file {}: expected PEM certificates (at most 64 KiB){}",
                               path, certs.ok() ? "" : ": " + Message(certs.status())));
  }
  o.proxy_ca_pem.emplace();
  for (const pki::Certificate& cert : *certs) *o.proxy_ca_pem += cert.Pem();
  return absl::OkStatus();
}

absl::Status AddReleaseKey(InstallOptions& o, const std::string& key, const ReadFile& read_file) {
  if (o.release_keys.size() >= kMaxReleaseKeys) {
    return Invalid(fmt::format("at most {} --release-key flags", kMaxReleaseKeys));
  }
  if (IsHex64(key)) {
    o.release_keys.push_back(absl::AsciiStrToLower(key));
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> pem = read_file(key);
  if (!pem.ok()) {
    return Invalid(fmt::format(
        "--release-key {}: neither an SPKI sha256 (64 hex characters) nor a readable file: {}", key,
        Message(pem.status())));
  }
  absl::StatusOr<pki::PublicKey> public_key = pki::PublicKey::FromPem(*pem);
  if (!public_key.ok()) {
    return Invalid(fmt::format("--release-key {}: expected a PEM public key (P-256): {}", key,
                               Message(public_key.status())));
  }
  // Re-encoded from the parsed key, so nothing but the key reaches the script.
  o.release_keys.push_back(public_key->ToPem());
  return absl::OkStatus();
}

absl::Status SetBinaryUrl(InstallOptions& o, const std::string& value, const ReadFile&) {
  if (value.starts_with("file:///")) {
    for (char c : value) {
      if (static_cast<unsigned char>(c) < 0x20) {
        return Invalid("--binary-url holds a control character");
      }
    }
  } else if (absl::StatusOr<Url> url = Url::Parse(value, {"https"}, true); !url.ok()) {
    return Invalid("--binary-url: " + Message(url.status()) + " (or a file:///path)");
  }
  o.binary_url = value;
  return absl::OkStatus();
}

absl::Status SetBinarySha256(InstallOptions& o, const std::string& value, const ReadFile&) {
  absl::StatusOr<Sha256Pin> sha = Sha256Pin::ParseHex(value);
  if (!sha.ok()) return Invalid("--binary-sha256: " + Message(sha.status()));
  o.binary_sha256 = sha->Hex();
  return absl::OkStatus();
}

struct Flag {
  std::string_view name;
  bool required = false;
  bool repeated = false;
  absl::Status (*apply)(InstallOptions&, const std::string&, const ReadFile&);
};

// In the order they are applied: a flag's check may read one applied before it.
constexpr Flag kFlags[] = {
    {"--gateway-url", true, false, SetGatewayUrl},
    {"--ca-pin", true, false, SetCaPin},
    {"--token", true, false, SetToken},
    {"--role", false, false, SetRole},
    {"--gateway-server-name", false, false, SetServerName},
    {"--websocket-url", false, false, SetWebSocketUrl},
    {"--proxy-ca-file", false, false, SetProxyCaFile},
    {"--release-key", false, true, AddReleaseKey},
    {"--binary-url", false, false, SetBinaryUrl},
    {"--binary-sha256", false, false, SetBinarySha256},
};

// What one flag alone cannot say.
absl::Status CheckTogether(const InstallOptions& o) {
  if (Url::Parse(o.gateway_url, {"https"})->host_is_ip() && !o.gateway_server_name) {
    return Invalid(
        "--gateway-server-name is required when --gateway-url names an IP address: the name the "
        "gateway certificate carries");
  }
  if (o.binary_url.has_value() != o.binary_sha256.has_value()) {
    return Invalid("--binary-url and --binary-sha256 go together");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<InstallOptions> ParseInstallFlags(const std::vector<std::string>& args,
                                                 const ReadFile& read_file) {
  // Every value, by flag, as given ("--name=value" or "--name value").
  std::map<std::string_view, std::vector<std::string>> given;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i];
    std::optional<std::string> value;
    if (std::size_t eq = name.find('='); name.starts_with("--") && eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    const Flag* flag = std::find_if(std::begin(kFlags), std::end(kFlags),
                                    [&](const Flag& f) { return f.name == name; });
    if (flag == std::end(kFlags)) return Invalid(fmt::format("unknown option \"{}\"", name));
    if (!value) {
      if (i + 1 >= args.size()) return Invalid(fmt::format("{} needs a value", name));
      value = args[++i];
    }
    std::vector<std::string>& values = given[flag->name];
    if (!values.empty() && !flag->repeated) return Invalid(fmt::format("{} is given twice", name));
    values.push_back(*std::move(value));
  }
  InstallOptions o;
  for (const Flag& flag : kFlags) {
    auto it = given.find(flag.name);
    if (it == given.end()) {
      if (flag.required) return Invalid(fmt::format("{} is required", flag.name));
      continue;
    }
    for (const std::string& value : it->second) {
      if (absl::Status s = flag.apply(o, value, read_file); !s.ok()) return s;
    }
  }
  if (absl::Status s = CheckTogether(o); !s.ok()) return s;
  return o;
}

absl::StatusOr<std::string> GenerateInstallScript(const InstallOptions& o) {
  if (o.role != "node" && o.role != "site") {
    return absl::InvalidArgumentError("role must be node or site");
  }
  std::vector<std::string> lines = ConfigLines(o);
  // What bcd will read: refuse to print an installer whose config the daemon would refuse.
  std::string check;
  for (const std::string& line : lines) check += Substituted(line, "") + "\n";
  if (absl::StatusOr<Config> config = Config::Parse(check, "config.toml"); !config.ok()) {
    return absl::InvalidArgumentError("the config it would write is invalid: " +
                                      Message(config.status()));
  }
  std::string script = fmt::format(
      "#!/bin/sh\n"
      "# shellcheck disable=SC2016 # the values below are single-quoted on purpose\n"
      "# Installs bcd as a {role} of the fleet at {url}.\n"
      "# Generated by `bcd install-script` (bcd {version}). Run it as root:\n"
      "#   sh install.sh [--root DIR] [--no-join] [--no-start]\n"
      "# --root DIR  install under DIR, not /: every path written, the ones inside config.toml\n"
      "#             and the unit too, is under DIR; no root needed, systemctl is not run\n"
      "# --no-join   leave the join for later (image builds: each machine joins at first boot)\n"
      "# --no-start  enable the service without starting it\n"
      "# Running it again is harmless: what is in place already stays; a joined node is not\n"
      "# joined again. It holds a join token: treat it as a secret.\n"
      "set -eu\n"
      "umask 077\n\n"
      "# ---- what it was generated with (single-quoted: never expanded)\n"
      "role={qrole}\n"
      "gateway_url={qurl}\n"
      "token={qtoken}\n"
      "binary_url={qbinary}\n"
      "binary_sha256={qsha}\n\n",
      fmt::arg("role", o.role), fmt::arg("url", o.gateway_url), fmt::arg("version", Version()),
      fmt::arg("qrole", ShellQuote(o.role)), fmt::arg("qurl", ShellQuote(o.gateway_url)),
      fmt::arg("qtoken", ShellQuote(o.token)),
      fmt::arg("qbinary", ShellQuote(o.binary_url.value_or(""))),
      fmt::arg("qsha", ShellQuote(o.binary_sha256.value_or(""))));
  // The files, written into $tmp first; `place` then moves each into the root.
  script +=
      "# write_files: config.toml, the unit and the embedded PEM files, into $tmp.\n"
      "write_files() {\n"
      "  mkdir -p \"$tmp/etc\"\n"
      "  {\n";
  for (const std::string& line : lines) script += "  " + PrintfLine(line);
  script += "  } >\"$tmp/config.toml\"\n";
  absl::StatusOr<std::string> unit =
      HereDoc(o.role == "site" ? kSiteUnit : kNodeUnit, "BCD_UNIT_END", "\"$tmp/unit\"");
  if (!unit.ok()) return unit.status();
  script += *unit;
  if (o.proxy_ca_pem) {
    absl::StatusOr<std::string> pem =
        HereDoc(*o.proxy_ca_pem, "BCD_PEM_END", "\"$tmp/etc/proxy-ca.pem\"");
    if (!pem.ok()) return pem.status();
    script += *pem;
  }
  for (std::size_t i = 0; i < o.release_keys.size(); ++i) {
    if (IsHex64(o.release_keys[i])) continue;
    script += "  mkdir -p \"$tmp/etc/release-keys\"\n";
    absl::StatusOr<std::string> pem = HereDoc(
        o.release_keys[i], "BCD_PEM_END", fmt::format("\"$tmp/etc/release-keys/{}.pem\"", i + 1));
    if (!pem.ok()) return pem.status();
    script += *pem;
  }
  script += "}\n";
  script += kBody;
  return script;
}

}  // namespace bcd::install
