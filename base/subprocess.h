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

}  // namespace bcd
