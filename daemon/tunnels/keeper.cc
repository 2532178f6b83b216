#include "daemon/tunnels/keeper.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <ctime>

#include "fmt/format.h"

namespace bcd::tunnels {
namespace {

// In the child, after fork: only async-signal-safe calls. Never returns.
[[noreturn]] void ExecChild(const Account& account, const ChildArgs& args) {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);  // bcd blocks SIGTERM and friends in its threads
  for (int s : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD}) signal(s, SIG_DFL);
  umask(022);  // an operator's session, not bcd's private files (the unit runs bcd with 0077)
  if (account.switch_user && (setgroups(account.groups.size(), account.groups.data()) != 0 ||
                              setgid(account.gid) != 0 || setuid(account.uid) != 0)) {
    _exit(126);
  }
  if (chdir(account.home.c_str()) != 0 && chdir("/") != 0) _exit(126);
  if (args.program.find('/') != std::string::npos) {
    execve(args.program.c_str(), args.argv.data(), args.envp.data());
  } else {
    // PATH search over the fixed PATH above.
    static const char* const kPath[] = {"/usr/local/sbin", "/usr/local/bin", "/usr/sbin",
                                        "/usr/bin",        "/sbin",          "/bin"};
    char path[4096];
    for (const char* dir : kPath) {
      std::size_t d = std::strlen(dir), p = args.program.size();
      if (d + 1 + p + 1 > sizeof path) continue;
      // The directory, then '/', then the program with its NUL: terminated by the last copy.
      std::memcpy(path, dir, d);  // NOLINT(bugprone-not-null-terminated-result)
      path[d] = '/';
      std::memcpy(path + d + 1, args.program.c_str(), p + 1);
      execve(path, args.argv.data(), args.envp.data());
    }
  }
  _exit(127);
}

// The tunnel's keeper: the process between bcd and what a shell or exec runs. It is a child
// subreaper, so whatever its command leaves behind (a setsid'd or double-forked process included)
// is reparented to it rather than to init; on SIGTERM from bcd (or bcd's death), or once the
// command exits, it kills every process below it and exits with the command's exit code
// (128 + the signal when one ended it). Only async-signal-safe calls: it runs in a fork of a
// multithreaded bcd and never execs.

// Sends SIGKILL to every process whose parent is this one (scanning /proc); true when it found one.
bool KillChildren() {
  int dir = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return false;
  pid_t self = getpid();
  bool found = false;
  alignas(8) char entries[4096];
  while (true) {
    long n = syscall(SYS_getdents64, dir, entries, sizeof entries);
    if (n <= 0) break;
    for (long at = 0; at < n;) {
      struct Entry {
        uint64_t ino;
        int64_t off;
        unsigned short reclen;
        unsigned char type;
        char name[1];
      };
      const auto* entry = reinterpret_cast<const Entry*>(entries + at);
      at += entry->reclen;
      pid_t pid = 0;
      const char* c = entry->name;
      for (; *c >= '0' && *c <= '9'; ++c) pid = pid * 10 + (*c - '0');
      if (*c != '\0' || pid <= 0) continue;
      // /proc/<pid>/stat: "pid (comm) state ppid ...", comm may hold anything: read after the
      // last ')'.
      char path[32] = "/proc/";
      char digits[16];
      int d = 0;
      for (pid_t v = pid; v > 0; v /= 10) digits[d++] = static_cast<char>('0' + v % 10);
      int p = 6;
      while (d > 0) path[p++] = digits[--d];
      const char* tail = "/stat";
      for (int i = 0; tail[i] != '\0'; ++i) path[p++] = tail[i];
      path[p] = '\0';
      int fd = open(path, O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      char stat[512];
      ssize_t got = read(fd, stat, sizeof stat - 1);
      close(fd);
      if (got <= 0) continue;
      stat[got] = '\0';
      char* close_paren = nullptr;
      for (char* q = stat; *q != '\0'; ++q) {
        if (*q == ')') close_paren = q;
      }
      if (close_paren == nullptr || close_paren[1] != ' ' || close_paren[2] == '\0') continue;
      const char* q = close_paren + 4;  // past ") S "
      pid_t parent = 0;
      for (; *q >= '0' && *q <= '9'; ++q) parent = parent * 10 + (*q - '0');
      if (parent == self) {
        kill(pid, SIGKILL);
        found = true;
      }
    }
  }
  close(dir);
  return found;
}

// Becomes the keeper of `command` (a child of this process, leader of its own process group when
// it made one). Never returns.
[[noreturn]] void Keep(pid_t command, const sigset_t& signals) {
  int code = 255;
  bool done = false;
  while (!done) {
    siginfo_t info{};
    int signal = sigwaitinfo(&signals, &info);
    if (signal == SIGTERM) break;
    if (signal != SIGCHLD) continue;
    int status = 0;
    pid_t ended;
    while ((ended = waitpid(-1, &status, WNOHANG)) > 0) {
      if (ended == command) {
        code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        done = true;
      }
    }
  }
  // Everything below goes: the command's group at once, then whatever is parented here, round
  // after round (the children of a killed process are reparented here), until nothing is left.
  while (true) {
    kill(-command, SIGKILL);
    kill(command, SIGKILL);
    KillChildren();
    int status = 0;
    pid_t ended;
    while ((ended = waitpid(-1, &status, WNOHANG)) > 0) {
      if (ended == command && !done) {
        code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        done = true;
      }
    }
    if (ended < 0 && errno == ECHILD) break;
    timespec pause{0, 2 * 1000 * 1000};
    nanosleep(&pause, nullptr);
  }
  _exit(code);
}

}  // namespace

absl::StatusOr<Account> LookUp(const std::string& user) {
  std::vector<char> buffer(16384);
  passwd entry{}, *found = nullptr;
  int rc = user.empty() ? getpwuid_r(getuid(), &entry, buffer.data(), buffer.size(), &found)
                        : getpwnam_r(user.c_str(), &entry, buffer.data(), buffer.size(), &found);
  if (rc != 0 || found == nullptr) {
    return absl::FailedPreconditionError(
        user.empty() ? "bcd's own user has no passwd entry"
                     : fmt::format("[tunnels] user \"{}\" does not exist here", user));
  }
  Account account;
  account.uid = entry.pw_uid;
  account.gid = entry.pw_gid;
  account.name = entry.pw_name;
  account.home = entry.pw_dir && *entry.pw_dir ? entry.pw_dir : "/";
  account.shell = entry.pw_shell && *entry.pw_shell ? entry.pw_shell : "/bin/sh";
  if (account.uid != geteuid()) {
    if (geteuid() != 0) {
      return absl::FailedPreconditionError(fmt::format(
          "tunnels as \"{}\" need bcd to run as root (it runs as uid {})", user, geteuid()));
    }
    account.switch_user = true;
    int count = 64;
    account.groups.resize(static_cast<std::size_t>(count));
    if (getgrouplist(account.name.c_str(), account.gid, account.groups.data(), &count) < 0) {
      account.groups.resize(static_cast<std::size_t>(count));
      getgrouplist(account.name.c_str(), account.gid, account.groups.data(), &count);
    }
    account.groups.resize(static_cast<std::size_t>(count));
  }
  return account;
}

void ChildArgs::Finish() {
  for (auto& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env_storage) envp.push_back(e.data());
  envp.push_back(nullptr);
}

ChildArgs MakeArgs(const Account& account, std::vector<std::string> argv, bool login) {
  ChildArgs args;
  if (login) {
    args.program = account.shell;
    std::string base = account.shell.substr(account.shell.rfind('/') + 1);
    args.argv_storage = {"-" + base};
  } else {
    args.program = argv.front();
    args.argv_storage = std::move(argv);
  }
  args.env_storage = {"HOME=" + account.home,
                      "USER=" + account.name,
                      "LOGNAME=" + account.name,
                      "SHELL=" + account.shell,
                      "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                      "TERM=xterm-256color"};
  args.Finish();
  return args;
}

[[noreturn]] void StartKept(const Account& account, const ChildArgs& args, bool own_group) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGCHLD);
  sigaddset(&signals, SIGTERM);
  sigprocmask(SIG_BLOCK, &signals, nullptr);
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  prctl(PR_SET_PDEATHSIG, SIGTERM);  // bcd gone: everything below goes too
  close_range(3, ~0U, 0);
  pid_t command = fork();
  if (command < 0) _exit(126);
  if (command == 0) {
    if (own_group) setpgid(0, 0);
    ExecChild(account, args);
  }
  if (own_group) setpgid(command, command);
  // The keeper holds none of the command's fds: its output ends when the command's does.
  int null = open("/dev/null", O_RDWR | O_CLOEXEC);
  for (int fd = 0; fd < 3; ++fd) dup2(null, fd);
  if (null > 2) close(null);
  Keep(command, signals);
}

int ExitCode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 255;
}

}  // namespace bcd::tunnels
