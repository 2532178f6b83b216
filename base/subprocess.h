#pragma once

// Running helper programs (nvidia-smi, dcgmi, ...) behind an interface, so collectors can be tested
// with canned output and never depend on what a test machine has installed.

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace bcd {

class CommandRunner {
 public:
  virtual ~CommandRunner() = default;
  // Runs argv (argv[0] looked up on PATH) with no stdin and returns its stdout. NotFound when the
  // program does not exist; an error when it exits non-zero, is killed, prints more than
  // `max_output` bytes, or runs past `timeout` (it is then killed). Blocks the calling thread.
  virtual absl::StatusOr<std::string> Run(const std::vector<std::string>& argv,
                                          std::chrono::milliseconds timeout,
                                          std::size_t max_output = 1 << 20) = 0;
};

// Runs real child processes (posix_spawn, a pipe for stdout, stderr discarded).
class SubprocessRunner final : public CommandRunner {
 public:
  absl::StatusOr<std::string> Run(const std::vector<std::string>& argv,
                                  std::chrono::milliseconds timeout,
                                  std::size_t max_output = 1 << 20) override;
};

// Like SubprocessRunner::Run, with `env` (NAME=value) added to the child's environment.
absl::StatusOr<std::string> RunWithEnv(const std::vector<std::string>& argv,
                                       const std::vector<std::string>& env,
                                       std::chrono::milliseconds timeout);

// Like SubprocessRunner::Run, but output past `max_output` is not an error: the child is killed,
// the first `max_output` bytes are returned and `*truncated` is set. When `stop` turns true (a
// cancel, a timeout, a shutdown) the child is killed within 100 ms and the answer is Cancelled.
absl::StatusOr<std::string> RunCapped(const std::vector<std::string>& argv,
                                      std::chrono::milliseconds timeout, std::size_t max_output,
                                      bool* truncated, const std::atomic<bool>* stop = nullptr);

// How a tool that reports its failures in words ended: its exit status and what it printed on
// stdout and stderr together (ipmitool says "failed" with status 0, and why a login failed on
// stderr).
struct ToolRun {
  int exit_code = 0;
  std::string output;
};
// Runs argv with `env` (NAME=value) added to its environment, stdout and stderr into one pipe.
// A non-zero exit is not an error here; the answer is an error only when the program cannot start
// (NotFound), runs past `timeout` or prints more than `max_output` (DeadlineExceeded, killed), is
// killed by a signal (Internal), or `stop` turns true (Cancelled, killed within 100 ms).
absl::StatusOr<ToolRun> RunTool(const std::vector<std::string>& argv,
                                const std::vector<std::string>& env,
                                std::chrono::milliseconds timeout,
                                const std::atomic<bool>* stop = nullptr,
                                std::size_t max_output = 1 << 20);

}  // namespace bcd
