#include "install/install_script.h"

#include <algorithm>
#include <map>

#include "absl/strings/ascii.h"
#include "config/config.h"
#include "fmt/format.h"
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

// The script after its values: everything that does not depend on the flags.
constexpr std::string_view kBody = R"SCRIPT(
say() { printf 'bcd-install: %s\n' "$*"; }
die() {
  printf 'bcd-install: error: %s\n' "$*" >&2
  exit 1
}

root=''
join=yes
start=yes
while [ $# -gt 0 ]; do
  case $1 in
    --root)
      [ $# -ge 2 ] || die "--root needs a directory"
      root=$2
      shift 2
      ;;
    --root=*)
      root=${1#--root=}
      shift
      ;;
    --no-join)
      join=no
      shift
      ;;
    --no-start)
      start=no
      shift
      ;;
    *) die "unknown option \"$1\" (this installer takes --root DIR, --no-join and --no-start)" ;;
  esac
done
if [ -n "$root" ]; then
  case $root in
    /*) ;;
    *) die "--root must be an absolute path, got \"$root\"" ;;
  esac
  case $root in
    *[!A-Za-z0-9._/+-]*) die "--root may hold only letters, digits and . _ / + -, got \"$root\"" ;;
  esac
  while [ "${root%/}" != "$root" ]; do root=${root%/}; done
fi

# ---- checks: nothing is written before all of them pass
os=$(uname -s)
[ "$os" = Linux ] || die "bcd runs on Linux only; this machine runs $os"
machine=$(uname -m)
case $machine in
  x86_64 | amd64) ;;
  aarch64 | arm64) ;;
  *) die "bcd runs on x86-64 and arm64 only; this machine is $machine" ;;
esac
if [ -z "$root" ] && [ "$(id -u)" != 0 ]; then
  die "run this as root: it installs a system service (or pass --root DIR to install under DIR)"
fi
for tool in cmp mktemp sed; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is needed and not installed"
done

bin=$root/usr/local/bin/bcd
etc=$root/etc/bcd
config=$etc/config.toml
state=$root/var/lib/bcd
unit_dir=$root/etc/systemd/system
unit_name=bcd-$role.service
unit=$unit_dir/$unit_name

# A machine is a node or a site agent, never both: its identity was issued for one role.
if [ "$role" = node ]; then other=site; else other=node; fi
if [ -f "$unit_dir/bcd-$other.service" ]; then
  die "this machine is installed as a $other ($unit_dir/bcd-$other.service); to make it a $role, first remove that: systemctl disable --now bcd-$other.service, then delete the unit, $etc and $state"
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/bcd-install.XXXXXX") || die "cannot make a temporary directory"
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' HUP INT TERM

# fetch URL FILE: https with curl or wget (https only, redirects included), or a local file://.
fetch() {
  case $1 in
    file://*) cp "${1#file://}" "$2" ;;
    *)
      if command -v curl >/dev/null 2>&1; then
        curl --fail --silent --show-error --location --proto '=https' --proto-redir '=https' \
          --retry 3 --output "$2" "$1"
      elif command -v wget >/dev/null 2>&1; then
        wget --quiet --https-only --tries=3 --output-document="$2" "$1"
      else
        die "neither curl nor wget is installed: one of them is needed to download bcd"
      fi
      ;;
  esac
}

if [ -n "$binary_url" ]; then
  command -v sha256sum >/dev/null 2>&1 || die "sha256sum is needed to check the download"
  say "downloading $binary_url"
  fetch "$binary_url" "$tmp/bcd" || die "could not download $binary_url"
  got=$(sha256sum "$tmp/bcd" | cut -d ' ' -f 1)
  if [ "$got" != "$binary_sha256" ]; then
    die "the download's sha256 is $got, not $binary_sha256: nothing was installed"
  fi
  chmod 0755 "$tmp/bcd"
  "$tmp/bcd" version >/dev/null 2>&1 || die "the downloaded bcd does not run on this $machine machine"
  say "sha256 checked: $binary_sha256"
else
  bin=''
  for candidate in "$root/usr/local/bin/bcd" "$root/usr/bin/bcd"; do
    if [ -x "$candidate" ]; then
      bin=$candidate
      break
    fi
  done
  if [ -z "$bin" ]; then
    die "no bcd at $root/usr/local/bin/bcd or $root/usr/bin/bcd: install the bcd package first, or generate this installer with --binary-url and --binary-sha256"
  fi
fi

# ---- what this machine will hold
write_files

# ---- from here on the machine changes
changed=no
# place FILE DEST MODE: DEST gets FILE's bytes (atomically, by rename) unless it holds them already.
place() {
  (umask 022 && mkdir -p "$(dirname "$2")")
  if [ -f "$2" ] && cmp -s "$1" "$2"; then
    chmod "$3" "$2"
    say "unchanged: $2"
    return 0
  fi
  cp "$1" "$2.bcd-new"
  chmod "$3" "$2.bcd-new"
  mv -f "$2.bcd-new" "$2"
  say "wrote $2"
  changed=yes
}

mkdir -p "$etc" "$state"
chmod 0700 "$etc" "$state"
if [ -n "$binary_url" ]; then
  place "$tmp/bcd" "$bin" 0755
else
  say "using the installed $bin"
fi
for file in "$tmp"/etc/*; do
  [ -f "$file" ] || continue
  place "$file" "$etc/${file#"$tmp"/etc/}" 0600
done
for file in "$tmp"/etc/release-keys/*; do
  [ -f "$file" ] || continue
  mkdir -p "$etc/release-keys"
  chmod 0700 "$etc/release-keys"
  place "$file" "$etc/release-keys/${file#"$tmp"/etc/release-keys/}" 0600
done
place "$tmp/config.toml" "$config" 0600
sed -e "s|/usr/bin/bcd|$bin|g" -e "s|/etc/bcd/config.toml|$config|g" "$tmp/unit" >"$tmp/unit.rooted"
place "$tmp/unit.rooted" "$unit" 0644

systemd=no
if [ -z "$root" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
  systemd=yes
fi
if [ -n "$root" ]; then
  (umask 022 && mkdir -p "$unit_dir/multi-user.target.wants")
  ln -sf "../$unit_name" "$unit_dir/multi-user.target.wants/$unit_name"
  say "enabled $unit_name under $root"
elif command -v systemctl >/dev/null 2>&1; then
  if [ "$systemd" = yes ]; then
    systemctl daemon-reload || die "systemctl daemon-reload failed"
  fi
  systemctl enable --quiet "$unit_name" || die "systemctl enable $unit_name failed"
  say "enabled $unit_name"
else
  say "no systemctl on this machine: $unit_name is installed but not enabled"
fi

joined=no
if [ "$join" = no ]; then
  say "not joining (--no-join): run \`$bin join --config $config --token-file -\` with the token on stdin"
elif [ -s "$state/identity.pem" ]; then
  say "already joined (an identity is in $state): not joining again"
else
  say "joining the fleet at $gateway_url as a $role"
  set +e
  printf '%s\n' "$token" | "$bin" join --config "$config" --role "$role" --token-file -
  rc=$?
  set -e
  case $rc in
    0) joined=yes ;;
    3) die "the gateway refused the join (the token may be used, expired or for another role): generate a new installer" ;;
    2) die "bcd join refused the config or its options (exit 2): see the message above" ;;
    *) die "bcd join failed (exit $rc): see the message above; running this installer again retries it" ;;
  esac
fi

if [ -n "$root" ]; then
  say "not started: installed under $root (run $bin $role --config $config)"
elif [ "$start" = no ]; then
  say "not started (--no-start): start it with \`systemctl start $unit_name\`"
elif [ "$systemd" = no ]; then
  say "systemd is not running here: start bcd with \`$bin $role --config $config\`"
elif [ "$changed" = yes ] || [ "$joined" = yes ]; then
  systemctl restart "$unit_name" || die "$unit_name did not start: see journalctl -u $unit_name"
  say "started $unit_name"
else
  systemctl start "$unit_name" || die "$unit_name did not start: see journalctl -u $unit_name"
  say "$unit_name is running"
fi
say "done: bcd $role for $gateway_url; check it with \`$bin status --config $config\`"
)SCRIPT";

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

absl::StatusOr<InstallOptions> ParseInstallFlags(
    const std::vector<std::string>& args,
    const std::function<absl::StatusOr<std::string>(const std::string&)>& read_file) {
  InstallOptions o;
  std::map<std::string, std::string, std::less<>> single;
  std::vector<std::string> release_keys;
  constexpr std::string_view kFlags[] = {"--gateway-url",   "--ca-pin",
                                         "--token",         "--role",
                                         "--websocket-url", "--proxy-ca-file",
                                         "--release-key",   "--binary-url",
                                         "--binary-sha256", "--gateway-server-name"};
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i];
    std::optional<std::string> value;
    if (std::size_t eq = name.find('='); name.starts_with("--") && eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    if (std::find(std::begin(kFlags), std::end(kFlags), name) == std::end(kFlags)) {
      return absl::InvalidArgumentError(fmt::format("unknown option \"{}\"", name));
    }
    if (!value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(fmt::format("{} needs a value", name));
      }
      value = args[++i];
    }
    if (name == "--release-key") {
      release_keys.push_back(*value);
    } else if (!single.emplace(name, *value).second) {
      return absl::InvalidArgumentError(fmt::format("{} is given twice", name));
    }
  }
  auto take = [&](std::string_view name) -> std::optional<std::string> {
    auto it = single.find(name);
    if (it == single.end()) return std::nullopt;
    return it->second;
  };
  for (std::string_view required : {"--gateway-url", "--ca-pin", "--token"}) {
    if (!take(required)) {
      return absl::InvalidArgumentError(fmt::format("{} is required", required));
    }
  }
  o.gateway_url = *take("--gateway-url");
  if (absl::StatusOr<Url> url = Url::Parse(o.gateway_url, {"https"}); !url.ok()) {
    return absl::InvalidArgumentError("--gateway-url: " + Message(url.status()));
  } else if (url->host_is_ip() && !take("--gateway-server-name")) {
    return absl::InvalidArgumentError(
        "--gateway-server-name is required when --gateway-url names an IP address: the name the "
        "gateway certificate carries");
  }
  if (absl::StatusOr<Sha256Pin> pin = Sha256Pin::ParseHex(*take("--ca-pin")); !pin.ok()) {
    return absl::InvalidArgumentError("--ca-pin: " + Message(pin.status()));
  } else {
    o.ca_pin = pin->Hex();
  }
  o.token = *take("--token");
  if (o.token.empty() || o.token.size() > kMaxTokenBytes) {
    return absl::InvalidArgumentError(
        fmt::format("--token must be 1 to {} bytes long", kMaxTokenBytes));
  }
  for (char c : o.token) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      return absl::InvalidArgumentError("--token holds a control character");
    }
  }
  o.role = take("--role").value_or("node");
  if (o.role != "node" && o.role != "site") {
    return absl::InvalidArgumentError(
        fmt::format("--role must be node or site, got \"{}\"", o.role));
  }
  o.gateway_server_name = take("--gateway-server-name");
  if (o.gateway_server_name) *o.gateway_server_name = absl::AsciiStrToLower(*o.gateway_server_name);
  o.websocket_url = take("--websocket-url");
  if (o.websocket_url) {
    if (absl::StatusOr<Url> url = Url::Parse(*o.websocket_url, {"wss"}); !url.ok()) {
      return absl::InvalidArgumentError("--websocket-url: " + Message(url.status()));
    }
  }
  if (std::optional<std::string> path = take("--proxy-ca-file")) {
    if (!o.websocket_url) {
      return absl::InvalidArgumentError(
          "--proxy-ca-file needs --websocket-url: it is trust for the WebSocket transport only");
    }
    absl::StatusOr<std::string> pem = read_file(*path);
    if (!pem.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("--proxy-ca-file {}: {}", *path, Message(pem.status())));
    }
    absl::StatusOr<std::vector<pki::Certificate>> certs = pki::ParsePemChain(*pem);
    if (pem->size() > kMaxPemBytes || !certs.ok() || certs->empty()) {
      return absl::InvalidArgumentError(
          fmt::format("--proxy-ca-file {}: expected PEM certificates (at most 64 KiB){}", *path,
                      certs.ok() ? "" : ": " + Message(certs.status())));
    }
    o.proxy_ca_pem.emplace();
    for (const pki::Certificate& cert : *certs) *o.proxy_ca_pem += cert.Pem();
  }
  if (release_keys.size() > kMaxReleaseKeys) {
    return absl::InvalidArgumentError(fmt::format("at most {} --release-key flags, got {}",
                                                  kMaxReleaseKeys, release_keys.size()));
  }
  for (const std::string& key : release_keys) {
    if (IsHex64(key)) {
      o.release_keys.push_back(absl::AsciiStrToLower(key));
      continue;
    }
    absl::StatusOr<std::string> pem = read_file(key);
    if (!pem.ok()) {
      return absl::InvalidArgumentError(fmt::format(
          "--release-key {}: neither an SPKI sha256 (64 hex characters) nor a readable file: {}",
          key, Message(pem.status())));
    }
    absl::StatusOr<pki::PublicKey> public_key = pki::PublicKey::FromPem(*pem);
    if (!public_key.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("--release-key {}: expected a PEM public key (P-256): {}", key,
                      Message(public_key.status())));
    }
    // Re-encoded from the parsed key, so nothing but the key reaches the script.
    o.release_keys.push_back(public_key->ToPem());
  }
  o.binary_url = take("--binary-url");
  o.binary_sha256 = take("--binary-sha256");
  if (o.binary_url.has_value() != o.binary_sha256.has_value()) {
    return absl::InvalidArgumentError("--binary-url and --binary-sha256 go together");
  }
  if (o.binary_url) {
    if (o.binary_url->starts_with("file:///")) {
      for (char c : *o.binary_url) {
        if (static_cast<unsigned char>(c) < 0x20) {
          return absl::InvalidArgumentError("--binary-url holds a control character");
        }
      }
    } else if (absl::StatusOr<Url> url = Url::Parse(*o.binary_url, {"https"}, true); !url.ok()) {
      return absl::InvalidArgumentError("--binary-url: " + Message(url.status()) +
                                        " (or a file:///path)");
    }
    absl::StatusOr<Sha256Pin> sha = Sha256Pin::ParseHex(*o.binary_sha256);
    if (!sha.ok()) {
      return absl::InvalidArgumentError("--binary-sha256: " + Message(sha.status()));
    }
    o.binary_sha256 = sha->Hex();
  }
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
      fmt::arg("role", o.role), fmt::arg("url", o.gateway_url), fmt::arg("version", BCD_VERSION),
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
