#pragma once

// The bcd command line. `main` only builds the environment and calls RunCli, so every command runs
// in tests with its output captured and its machine facts replaced.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <istream>
#include <ostream>
#include <string>
#include <vector>

#include "base/subprocess.h"

namespace bcd {

// Exit codes, as the product documents them.
enum ExitCode : int {
  kExitOk = 0,
  kExitOther = 1,
  kExitUsage = 2,  // bad usage or a bad config
  kExitJoinRefused = 3,
  kExitIdentityGone = 4,  // identity expired or revoked
};

struct CliEnv {
  std::ostream& out;
  std::ostream& err;
  std::istream* in = nullptr;        // stdin, for `--token-file -`
  std::filesystem::path root = "/";  // where inventory reads /proc, /sys and /etc
  std::string architecture;          // uname -m
  CommandRunner* runner = nullptr;
  std::function<uint64_t()> now;  // unix seconds
  std::function<void(std::chrono::seconds)> sleep;
  std::filesystem::path default_config{"/etc/bcd/config.toml"};
  // The whole command line (argv[0] included), to re-execute with after a daemon.upgrade.
  std::vector<std::string> argv;
  // The binary this process runs (/proc/self/exe at start), which daemon.upgrade replaces; empty
  // when unknown (tests), and then daemon.upgrade is refused.
  std::filesystem::path binary;
};

// args excludes the program name.
int RunCli(const std::vector<std::string>& args, const CliEnv& env);

}  // namespace bcd
