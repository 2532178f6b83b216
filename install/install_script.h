#pragma once

// `bcd install-script`: the POSIX sh installer that turns a fresh machine into a node (or a site
// agent) with one pasted command. Generation validates every flag the way the daemon will read it,
// so a script that is printed installs a config bcd accepts.
//
// The script (see install_script.cc for its text) checks root, Linux and x86-64/arm64; downloads
// the binary with curl or wget and checks its sha256 before it writes anything; writes
// /etc/bcd/config.toml (0600) and the unit; enables it; runs `bcd join` once (the token goes on
// stdin, never on a command line); starts the service; and says what it did. Every value is a
// single-quoted shell word and a TOML basic string, so no flag can inject shell or TOML.

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace bcd::install {

struct InstallOptions {
  std::string gateway_url;
  std::string ca_pin;  // lower-case hex
  std::string token;
  std::string role = "node";  // node | site
  std::optional<std::string> gateway_server_name;
  std::optional<std::string> websocket_url;
  std::optional<std::string> proxy_ca_pem;  // the certificates themselves, embedded in the script
  // Each an SPKI sha256 (hex) or a PEM public key (embedded, written to /etc/bcd/release-keys/).
  std::vector<std::string> release_keys;
  std::optional<std::string> binary_url;     // https:// or file://
  std::optional<std::string> binary_sha256;  // lower-case hex
};

// Reads the flags of `bcd install-script` (without the command name). `read_file` reads the files
// that --proxy-ca-file and --release-key name. Errors name the flag and what was wrong.
absl::StatusOr<InstallOptions> ParseInstallFlags(
    const std::vector<std::string>& args,
    const std::function<absl::StatusOr<std::string>(const std::string&)>& read_file);

// The installer for `options`, which ParseInstallFlags produced (or which pass its checks).
absl::StatusOr<std::string> GenerateInstallScript(const InstallOptions& options);

// `value` as one single-quoted sh word: 'it'\''s'.
std::string ShellQuote(std::string_view value);

}  // namespace bcd::install
