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

#include "fmt/format.h"

extern char** environ;

namespace bcd {
namespace {

// Closes a file descriptor when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Reset(); }
  int get() const { return fd_; }
  void Reset() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

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
                                     const std::vector<std::string>* env = nullptr);

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

namespace {

absl::StatusOr<std::string> RunChild(const std::vector<std::string>& argv,
                                     std::chrono::milliseconds timeout, std::size_t max_output,
                                     bool* truncated, const std::atomic<bool>* stop,
                                     const std::vector<std::string>* env) {
  if (argv.empty()) return absl::InvalidArgumentError("no program to run");
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(fmt::format("pipe: {}", std::strerror(errno)));
  }
  Fd read_end(fds[0]);
  Fd write_end(fds[1]);

  SpawnSetup setup;
  posix_spawn_file_actions_addopen(&setup.actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&setup.actions, write_end.get(), STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&setup.actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
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
  pid_t pid = 0;
  std::vector<char*> envp;
  if (env != nullptr) {
    for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
    for (const std::string& entry : *env) envp.push_back(const_cast<char*>(entry.c_str()));
    envp.push_back(nullptr);
  }
  int rc = posix_spawnp(&pid, args[0], &setup.actions, &setup.attr, args.data(),
                        env != nullptr ? envp.data() : environ);
  if (rc != 0) {
    if (rc == ENOENT) return absl::NotFoundError(fmt::format("{}: not found", argv[0]));
    return absl::InternalError(fmt::format("{}: cannot start: {}", argv[0], std::strerror(rc)));
  }
  write_end.Reset();

  std::string output;
  std::string failure;
  bool stopped = false;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  char buffer[8192];
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      failure =
          fmt::format("{}: ran past its {} ms limit and was killed", argv[0], timeout.count());
      break;
    }
    if (stop != nullptr && stop->load()) {
      stopped = true;
      failure = fmt::format("{}: stopped", argv[0]);
      break;
    }
    pollfd pfd{read_end.get(), POLLIN, 0};
    // With a stop flag to watch, wake at least every 100 ms.
    int wait =
        static_cast<int>(stop != nullptr ? std::min<int64_t>(left.count(), 100) : left.count());
    int ready = poll(&pfd, 1, wait);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    ssize_t n = read(read_end.get(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (output.size() + static_cast<std::size_t>(n) > max_output) {
      if (truncated != nullptr) {
        output.append(buffer, max_output - output.size());
        *truncated = true;
        kill(pid, SIGKILL);
        break;
      }
      failure = fmt::format("{}: printed more than {} bytes", argv[0], max_output);
      break;
    }
    output.append(buffer, static_cast<std::size_t>(n));
  }
  if (!failure.empty()) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (stopped) return absl::CancelledError(failure);
  if (!failure.empty()) return absl::DeadlineExceededError(failure);
  if (truncated != nullptr && *truncated) return output;  // killed on purpose
  if (WIFSIGNALED(status)) {
    return absl::InternalError(fmt::format("{}: killed by signal {}", argv[0], WTERMSIG(status)));
  }
  if (WEXITSTATUS(status) == 127 && output.empty()) {
    return absl::NotFoundError(fmt::format("{}: not found", argv[0]));
  }
  if (WEXITSTATUS(status) != 0) {
    return absl::InternalError(
        fmt::format("{}: exited with status {}", argv[0], WEXITSTATUS(status)));
  }
  return output;
}

}  // namespace

}  // namespace bcd
