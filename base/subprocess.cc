#include "base/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/fd.h"
#include "fmt/format.h"

extern char** environ;

namespace bcd {
namespace {

// posix_spawn file actions and attributes, destroyed on scope exit.
struct SpawnSetup {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  SpawnSetup() {
    posix_spawn_file_actions_init(&actions);
    posix_spawnattr_init(&attr);
  }
  ~SpawnSetup() {
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
  }
};

absl::StatusOr<std::string> RunChild(const std::vector<std::string>& argv,
                                     std::chrono::milliseconds timeout, std::size_t max_output,
                                     bool* truncated, const std::atomic<bool>* stop,
                                     const std::vector<std::string>* env = nullptr,
                                     int* exit_code = nullptr);

}  // namespace

absl::StatusOr<std::string> SubprocessRunner::Run(const std::vector<std::string>& argv,
                                                  std::chrono::milliseconds timeout,
                                                  std::size_t max_output) {
  return RunChild(argv, timeout, max_output, nullptr, nullptr);
}

absl::StatusOr<std::string> RunWithEnv(const std::vector<std::string>& argv,
                                       const std::vector<std::string>& env,
                                       std::chrono::milliseconds timeout) {
  return RunChild(argv, timeout, 1 << 20, nullptr, nullptr, &env);
}

absl::StatusOr<std::string> RunCapped(const std::vector<std::string>& argv,
                                      std::chrono::milliseconds timeout, std::size_t max_output,
                                      bool* truncated, const std::atomic<bool>* stop) {
  *truncated = false;
  return RunChild(argv, timeout, max_output, truncated, stop);
}

absl::StatusOr<ToolRun> RunTool(const std::vector<std::string>& argv,
                                const std::vector<std::string>& env,
                                std::chrono::milliseconds timeout, const std::atomic<bool>* stop,
                                std::size_t max_output) {
  ToolRun run;
  absl::StatusOr<std::string> output =
      RunChild(argv, timeout, max_output, nullptr, stop, &env, &run.exit_code);
  if (!output.ok()) return output.status();
  run.output = *std::move(output);
  return run;
}

namespace {

// Starts argv with stdout on `write_end`, stdin on /dev/null, stderr on /dev/null (or on
// `write_end` with `merge`), nothing else of bcd's, and `env` added to the environment when given.
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const Fd& write_end,
                            const std::vector<std::string>* env, bool merge) {
  SpawnSetup setup;
  posix_spawn_file_actions_addopen(&setup.actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&setup.actions, write_end.get(), STDOUT_FILENO);
  if (merge) {
    posix_spawn_file_actions_adddup2(&setup.actions, write_end.get(), STDERR_FILENO);
  } else {
    posix_spawn_file_actions_addopen(&setup.actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  }
  // The child gets its three standard fds and nothing else of bcd's, close-on-exec or not.
  posix_spawn_file_actions_addclosefrom_np(&setup.actions, 3);
  // The child gets default signal dispositions and an empty mask whatever the daemon blocks.
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&setup.attr, &all);
  posix_spawnattr_setsigmask(&setup.attr, &none);
  posix_spawnattr_setflags(&setup.attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);

  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  if (env != nullptr) {
    for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
    for (const std::string& entry : *env) envp.push_back(const_cast<char*>(entry.c_str()));
    envp.push_back(nullptr);
  }
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, args[0], &setup.actions, &setup.attr, args.data(),
                        env != nullptr ? envp.data() : environ);
  if (rc == ENOENT) return absl::NotFoundError(fmt::format("{}: not found", argv[0]));
  if (rc != 0) {
    return absl::InternalError(fmt::format("{}: cannot start: {}", argv[0], std::strerror(rc)));
  }
  return pid;
}

// What reading the child's stdout came to.
struct Collected {
  std::string output;
  std::string failure;   // why the child must be killed; empty when it was not
  bool stopped = false;  // the stop flag turned
};

// Reads `from` until EOF, the deadline, the stop flag or too much output. With `truncated`, too
// much output is cut at `max_output` (and the child killed) rather than a failure.
Collected Collect(const std::string& program, pid_t pid, const Fd& from,
                  std::chrono::milliseconds timeout, std::size_t max_output, bool* truncated,
                  const std::atomic<bool>* stop) {
  Collected c;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  char buffer[8192];
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      c.failure =
          fmt::format("{}: ran past its {} ms limit and was killed", program, timeout.count());
      return c;
    }
    if (stop != nullptr && stop->load()) {
      c.stopped = true;
      c.failure = fmt::format("{}: stopped", program);
      return c;
    }
    pollfd pfd{from.get(), POLLIN, 0};
    // With a stop flag to watch, wake at least every 100 ms.
    int wait =
        static_cast<int>(stop != nullptr ? std::min<int64_t>(left.count(), 100) : left.count());
    int ready = poll(&pfd, 1, wait);
    if (ready <= 0) continue;  // EINTR or nothing yet
    ssize_t n = read(from.get(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return c;
    if (c.output.size() + static_cast<std::size_t>(n) > max_output) {
      if (truncated != nullptr) {
        c.output.append(buffer, max_output - c.output.size());
        *truncated = true;
        kill(pid, SIGKILL);
        return c;
      }
      c.failure = fmt::format("{}: printed more than {} bytes", program, max_output);
      return c;
    }
    c.output.append(buffer, static_cast<std::size_t>(n));
  }
}

// The answer once the child is reaped. With `exit_code`, a non-zero exit is not an error: it is
// written there.
absl::StatusOr<std::string> Verdict(const std::string& program, int status, Collected c,
                                    bool truncated, int* exit_code) {
  if (c.stopped) return absl::CancelledError(c.failure);
  if (!c.failure.empty()) return absl::DeadlineExceededError(c.failure);
  if (truncated) return std::move(c.output);  // killed on purpose
  if (WIFSIGNALED(status)) {
    return absl::InternalError(fmt::format("{}: killed by signal {}", program, WTERMSIG(status)));
  }
  if (exit_code != nullptr) {
    *exit_code = WEXITSTATUS(status);
    return std::move(c.output);
  }
  if (WEXITSTATUS(status) == 127 && c.output.empty()) {
    return absl::NotFoundError(fmt::format("{}: not found", program));
  }
  if (WEXITSTATUS(status) != 0) {
    return absl::InternalError(
        fmt::format("{}: exited with status {}", program, WEXITSTATUS(status)));
  }
  return std::move(c.output);
}

absl::StatusOr<std::string> RunChild(const std::vector<std::string>& argv,
                                     std::chrono::milliseconds timeout, std::size_t max_output,
                                     bool* truncated, const std::atomic<bool>* stop,
                                     const std::vector<std::string>* env, int* exit_code) {
  if (argv.empty()) return absl::InvalidArgumentError("no program to run");
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(fmt::format("pipe: {}", std::strerror(errno)));
  }
  Fd read_end(fds[0]);
  Fd write_end(fds[1]);
  absl::StatusOr<pid_t> pid = Spawn(argv, write_end, env, exit_code != nullptr);
  if (!pid.ok()) return pid.status();
  write_end.reset();
  Collected collected = Collect(argv[0], *pid, read_end, timeout, max_output, truncated, stop);
  if (!collected.failure.empty()) kill(*pid, SIGKILL);
  int status = 0;
  while (waitpid(*pid, &status, 0) < 0 && errno == EINTR) {
  }
  return Verdict(argv[0], status, std::move(collected), truncated != nullptr && *truncated,
                 exit_code);
}

}  // namespace

}  // namespace bcd
