// bcd: parse the command line and run it. Everything else lives in the libraries.

#include <sys/utsname.h>

#include <ctime>
#include <filesystem>
#include <iostream>
#include <thread>

#include "app/cli.h"
#include "base/subprocess.h"
#include "transport/tls.h"

int main(int argc, char** argv) {
  bcd::transport::StructureGrpcLogs();
  utsname uts{};
  uname(&uts);
  bcd::SubprocessRunner runner;
  bcd::CliEnv env{
      .out = std::cout,
      .err = std::cerr,
      .in = &std::cin,
      .root = "/",
      .architecture = uts.machine,
      .runner = &runner,
      .now = [] { return static_cast<uint64_t>(std::time(nullptr)); },
      .sleep = [](std::chrono::seconds delay) { std::this_thread::sleep_for(delay); },
      .default_config = "/etc/bcd/config.toml",
      .argv = std::vector<std::string>(argv, argv + argc),
  };
  // Read before anything can rename it: after an upgrade's swap this process's executable is
  // the kept previous binary, and the path is what the new one is installed at.
  std::error_code ec;
  env.binary = std::filesystem::read_symlink("/proc/self/exe", ec);
  return bcd::RunCli(std::vector<std::string>(argv + 1, argv + argc), env);
}
