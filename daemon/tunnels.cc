#include "daemon/tunnels.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pty.h>
#include <pwd.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>

#include "fmt/format.h"
#include "proto/absl_compat.h"

namespace bcd {

namespace v1 = bettercompute::agent::v1;

namespace {

constexpr std::size_t kChunk = 32 * 1024;

// Who a shell or exec runs as, looked up before fork (nothing after fork may allocate).
struct Account {
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;
  std::string name, home, shell;
  bool switch_user = false;
};

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

// argv and envp as the child needs them, built before fork.
struct ChildArgs {
  std::vector<std::string> argv_storage, env_storage;
  std::vector<char*> argv, envp;
  std::string program;
  void Finish() {
    for (auto& a : argv_storage) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env_storage) envp.push_back(e.data());
    envp.push_back(nullptr);
  }
};

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
      std::memcpy(path, dir, d);
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

// In the child of bcd's fork, with the command's standard fds already on 0..2: becomes a
// subreaper, closes every other fd bcd had (another tunnel's stdin pipe among them), starts the
// command and keeps it. `own_group`: the command leads a process group of its own (exec).
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

bool WriteAll(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    ssize_t n = write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

int ExitCode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 255;
}

v1::TunnelFrame Data(uint32_t channel, const char* bytes, std::size_t size) {
  v1::TunnelFrame frame;
  frame.mutable_data()->set_channel(channel);
  frame.mutable_data()->set_data(bytes, size);
  return frame;
}

v1::TunnelFrame Closed(int exit_code, std::string reason = "") {
  v1::TunnelFrame frame;
  frame.mutable_closed()->set_exit_code(exit_code);
  frame.mutable_closed()->set_reason(std::move(reason));
  return frame;
}

// Connects to host:port within 10 s when a rule allows the address it resolves to.
absl::StatusOr<int> Dial(const std::string& host, uint16_t port,
                         const std::vector<TunnelAllowRule>* allow) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(fmt::format("{}: {}", host, gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> list(found, freeaddrinfo);
  std::string refused;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    char text[INET6_ADDRSTRLEN] = {0};
    const void* bytes =
        a->ai_family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr)
            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr);
    inet_ntop(a->ai_family, bytes, text, sizeof text);
    if (allow != nullptr) {
      bool allowed = false;
      for (const TunnelAllowRule& rule : *allow) allowed |= rule.Allows(host, text, port);
      if (!allowed) {
        refused = text;
        continue;
      }
    }
    int fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    int rc = connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int error = ETIMEDOUT;
      socklen_t length = sizeof error;
      if (poll(&p, 1, 10000) == 1) getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
      rc = error == 0 ? 0 : -1;
      errno = error;
    }
    if (rc == 0) {
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return fd;
    }
    std::string why = std::strerror(errno);
    close(fd);
    return absl::UnavailableError(fmt::format("{}:{}: {}", host, port, why));
  }
  if (!refused.empty()) {
    return absl::PermissionDeniedError(
        fmt::format("{}:{} ({}) is not allowed by [tunnels] allow", host, port, refused));
  }
  return absl::UnavailableError(fmt::format("{}:{}: no address to connect to", host, port));
}

}  // namespace

struct TunnelRunner::Tunnel {
  std::string id;
  std::optional<pki::TunnelTicket> ticket;
  std::unique_ptr<transport::TunnelStream> stream;
  std::thread thread;
  std::atomic<bool> done{false};

  std::mutex mu;
  std::condition_variable cv;
  bool closing = false;      // guarded by mu: the operator's side ended
  bool reader_done = false;  // guarded by mu
  pid_t keeper = -1;         // guarded by mu: told (SIGTERM) to end everything on close
  int socket = -1;           // guarded by mu: the tcp socket to shut down on close
  int input = -1;            // guarded by mu: where channel 0 goes (stdin pipe, PTY, socket)
  int pty = -1;              // guarded by mu: for resize

  // The other side is gone or asked to close: stop what runs here.
  void Stop() {
    std::lock_guard<std::mutex> lock(mu);
    closing = true;
    if (keeper > 0) kill(keeper, SIGTERM);
    if (socket >= 0) shutdown(socket, SHUT_RDWR);
  }

  // Reads the stream until it ends: channel 0 to `input`, resize to the PTY, closed = stop.
  void ReadStream() {
    v1::TunnelFrame frame;
    while (stream->Read(&frame)) {
      if (frame.has_data() && frame.data().channel() == 0) {
        int fd;
        bool is_socket;
        {
          std::lock_guard<std::mutex> lock(mu);
          fd = input;
          is_socket = socket >= 0 && input == socket;
        }
        if (fd < 0) continue;
        if (frame.data().data().empty()) {
          // End of input: EOF on stdin, or a half-close of the connection.
          std::lock_guard<std::mutex> lock(mu);
          if (is_socket) {
            shutdown(input, SHUT_WR);
          } else if (pty < 0 && input >= 0) {
            close(input);
            input = -1;
          }
          continue;
        }
        // Blocks while the other end does not read: flow control reaches the gateway.
        if (!WriteAll(fd, frame.data().data().data(), frame.data().data().size())) continue;
      } else if (frame.has_resize()) {
        std::lock_guard<std::mutex> lock(mu);
        if (pty >= 0) {
          winsize size{};
          size.ws_row =
              static_cast<unsigned short>(std::min<uint32_t>(frame.resize().rows(), 1000));
          size.ws_col =
              static_cast<unsigned short>(std::min<uint32_t>(frame.resize().cols(), 1000));
          ioctl(pty, TIOCSWINSZ, &size);
        }
      } else if (frame.has_closed()) {
        break;
      }
    }
    Stop();
    std::lock_guard<std::mutex> lock(mu);
    reader_done = true;
    cv.notify_all();
  }

  // Sends what `fds` yield (channel i for fds[i]) until all reach EOF or the tunnel closes.
  void Pump(std::vector<int> fds) {
    std::vector<char> buffer(kChunk);
    std::vector<bool> open(fds.size(), true);
    while (true) {
      std::vector<pollfd> polls;
      std::vector<std::size_t> index;
      for (std::size_t i = 0; i < fds.size(); ++i) {
        if (open[i]) {
          polls.push_back({fds[i], POLLIN, 0});
          index.push_back(i);
        }
      }
      if (polls.empty()) return;
      if (poll(polls.data(), polls.size(), 500) < 0 && errno != EINTR) return;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (closing && keeper <= 0 && socket < 0) return;
      }
      for (std::size_t p = 0; p < polls.size(); ++p) {
        if (polls[p].revents == 0) continue;
        std::size_t i = index[p];
        ssize_t n = read(fds[i], buffer.data(), buffer.size());
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {  // EOF (or EIO from a PTY whose shell is gone)
          open[i] = false;
          continue;
        }
        if (!stream->Write(
                Data(static_cast<uint32_t>(i), buffer.data(), static_cast<std::size_t>(n)))) {
          return;  // the stream is gone
        }
      }
    }
  }

  // Ends the stream: closed, then a clean end; cancelled if the gateway does not end it in 5 s.
  void Finish(v1::TunnelFrame closed) {
    stream->Write(closed);
    stream->CloseSend();
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, std::chrono::seconds(5), [&] { return reader_done; })) {
      lock.unlock();
      stream->Cancel();
    }
  }
};

absl::StatusOr<TunnelAccess> TunnelAccess::FromSection(const v1::AccessSection& section,
                                                       uint32_t config_max) {
  TunnelAccess access;
  for (const std::string& op : section.allowed_ops()) {
    if (op != "shell" && op != "exec" && op != "tcp" && op != "instance-tcp") {
      return absl::InvalidArgumentError(fmt::format(
          "allowed_ops: \"{}\" is not shell, exec, tcp or instance-tcp", op.substr(0, 64)));
    }
    access.ops.insert(op);
  }
  if (section.max_tunnels() > kMaxTunnels) {
    return absl::InvalidArgumentError(
        fmt::format("max_tunnels {} is above {}", section.max_tunnels(), kMaxTunnels));
  }
  access.max =
      section.max_tunnels() == 0 ? config_max : std::min(config_max, section.max_tunnels());
  if (!section.tunnel_jwks().empty()) {
    absl::StatusOr<std::size_t> keys = pki::CheckJwks(section.tunnel_jwks());
    if (!keys.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("tunnel_jwks: {}", ToStd(keys.status().message())));
    }
  }
  access.jwks = section.tunnel_jwks();
  return access;
}

absl::StatusOr<std::unique_ptr<TunnelRunner>> TunnelRunner::Create(TunnelRunnerOptions options,
                                                                   Logger* log) {
  // A tunnel's process or peer may go away while bcd writes to it: that is an error to handle,
  // not a signal that ends the daemon. (Children get the default back before exec.)
  signal(SIGPIPE, SIG_IGN);
  absl::StatusOr<pki::JtiSet> jti = pki::JtiSet::Load(options.state_dir / "tunnel-jti");
  if (!jti.ok()) return jti.status();
  return std::unique_ptr<TunnelRunner>(new TunnelRunner(std::move(options), log, *std::move(jti)));
}

TunnelRunner::~TunnelRunner() { CloseAll(); }

absl::Status TunnelRunner::Refuse(const std::string& tunnel_id, std::string why) {
  log_->Warn("tunnel.refused", {{"tunnel_id", tunnel_id}, {"reason", why}});
  if (options_.event) {
    options_.event("tunnel.refused", "tunnel refused: " + why, {{"tunnel_id", tunnel_id}});
  }
  return absl::PermissionDeniedError(why);
}

void TunnelRunner::Reap() {
  for (auto it = tunnels_.begin(); it != tunnels_.end();) {
    if ((*it)->done.load()) {
      if ((*it)->thread.joinable()) (*it)->thread.join();
      it = tunnels_.erase(it);
    } else {
      ++it;
    }
  }
}

int TunnelRunner::active() const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const auto& t : tunnels_) n += !t->done.load();
  return n;
}

void TunnelRunner::CloseAll() {
  std::list<std::shared_ptr<Tunnel>> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    all.swap(tunnels_);
  }
  for (auto& t : all) {
    t->Stop();
    t->stream->Cancel();
  }
  for (auto& t : all) {
    if (t->thread.joinable()) t->thread.join();
  }
}

absl::Status TunnelRunner::Open(const v1::OpenTunnel& open, transport::FrameStream& session,
                                const std::string& session_id) {
  const std::string& id = open.tunnel_id();
  if (id.empty() || id.size() > 128)
    return Refuse(id.substr(0, 128), "a tunnel id of 1 to 128 bytes");
  absl::StatusOr<TunnelAccess> access = TunnelAccess::FromSection(
      options_.access ? options_.access() : v1::AccessSection(), options_.max);
  if (!access.ok()) {
    return Refuse(id, fmt::format("the access section was not applied: {}",
                                  ToStd(access.status().message())));
  }
  if (access->jwks.empty()) {
    return Refuse(id, "no tunnel keys: the desired state's access section has no tunnel_jwks");
  }
  int64_t now = options_.now();
  absl::StatusOr<pki::TunnelTicket> ticket = pki::TunnelTicket::Verify(
      open.ticket(), access->jwks,
      {.node_id = options_.node_id, .session_id = session_id, .tunnel_id = id, .now = now});
  if (!ticket.ok()) return Refuse(id, std::string(ToStd(ticket.status().message())));
  if (!access->ops.contains(ticket->op())) {
    return Refuse(
        id, fmt::format("op \"{}\" is not in the access section's allowed_ops", ticket->op()));
  }
  if (ticket->op() == "instance-tcp" && !options_.instance_dial) {
    return Refuse(id, "instance-tcp is not offered here (no tunnel.instance-dial)");
  }
  std::optional<Account> account;
  if (ticket->op() == "shell" || ticket->op() == "exec") {
    absl::StatusOr<Account> found = LookUp(options_.user);
    if (!found.ok()) return Refuse(id, std::string(ToStd(found.status().message())));
    account = *std::move(found);
  }
  auto tunnel = std::make_shared<Tunnel>();
  tunnel->id = id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Reap();
    if (tunnels_.size() >= access->max) {
      return Refuse(id, fmt::format("{} tunnels are open, the most the access section and "
                                    "[tunnels] max allow",
                                    tunnels_.size()));
    }
    if (absl::Status s = jti_.Use(*ticket, now); !s.ok()) {
      return Refuse(id, absl::IsAlreadyExists(s) ? "the ticket's jti was used before"
                                                 : std::string(ToStd(s.message())));
    }
  }
  absl::StatusOr<std::unique_ptr<transport::TunnelStream>> stream = session.OpenTunnel();
  if (!stream.ok()) return Refuse(id, std::string(ToStd(stream.status().message())));
  tunnel->stream = *std::move(stream);
  tunnel->ticket = *std::move(ticket);
  log_->Info("tunnel.open", {{"tunnel_id", id}, {"op", tunnel->ticket->op()}});
  std::lock_guard<std::mutex> lock(mu_);
  tunnels_.push_back(tunnel);
  tunnel->thread = std::thread([this, tunnel, account = std::move(account)] {
    Tunnel& t = *tunnel;
    const pki::TunnelTicket& ticket = *t.ticket;
    v1::TunnelFrame opened;
    opened.mutable_opened()->set_tunnel_id(t.id);
    std::thread reader;
    std::vector<int> to_close;
    v1::TunnelFrame closed = Closed(0);
    if (!t.stream->Write(opened)) {
      t.stream->Cancel();
      t.stream->Finish();
      t.done = true;
      return;
    }
    // The operator's frames are read only once their destination exists: a frame read earlier
    // (stdin and its end, say) would have nowhere to go.
    auto start_reader = [&] {
      if (!reader.joinable()) reader = std::thread([&t] { t.ReadStream(); });
    };
    if (ticket.op() == "exec" || ticket.op() == "shell") {
      bool shell = ticket.op() == "shell";
      ChildArgs args = MakeArgs(*account, ticket.cmd(), shell);
      int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
      int master = -1;
      pid_t pid = -1;
      // `pid` is the keeper (StartKept), which runs the command below it.
      if (shell) {
        winsize size{};
        size.ws_row = ticket.rows() ? ticket.rows() : 24;
        size.ws_col = ticket.cols() ? ticket.cols() : 80;
        pid = forkpty(&master, nullptr, nullptr, &size);
        if (pid == 0) StartKept(*account, args, /*own_group=*/false);
        if (master >= 0) fcntl(master, F_SETFD, FD_CLOEXEC);
      } else if (pipe2(in, O_CLOEXEC) == 0 && pipe2(out, O_CLOEXEC) == 0 &&
                 pipe2(err, O_CLOEXEC) == 0) {
        pid = fork();
        if (pid == 0) {
          // A pipe end that landed on 0..2 (bcd started with a standard fd closed) is moved out
          // of the way first, so one dup2 cannot overwrite another's source.
          int fds[3] = {in[0], out[1], err[1]};
          for (int& fd : fds) {
            if (fd < 3) fd = fcntl(fd, F_DUPFD, 3);
          }
          for (int i = 0; i < 3; ++i) dup2(fds[i], i);
          StartKept(*account, args, /*own_group=*/true);
        }
      }
      if (pid < 0) {
        closed = Closed(255, fmt::format("cannot start: {}", std::strerror(errno)));
      } else {
        for (int fd : {in[0], out[1], err[1]}) {
          if (fd >= 0) close(fd);
        }
        {
          std::lock_guard<std::mutex> lock(t.mu);
          t.keeper = pid;
          t.input = shell ? master : in[1];
          t.pty = master;
          if (t.closing) kill(pid, SIGTERM);
        }
        start_reader();
        t.Pump(shell ? std::vector<int>{master} : std::vector<int>{out[0], err[0]});
        {
          // The command's output ended: it exited (and the keeper killed what it left behind),
          // or the tunnel closed. Either way the keeper ends everything and exits.
          std::lock_guard<std::mutex> lock(t.mu);
          if (t.closing) kill(pid, SIGTERM);
        }
        int status = 0;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        std::lock_guard<std::mutex> lock(t.mu);
        t.keeper = -1;
        // Closed once the stream reader is done with them (it may be writing to the input).
        if (t.input >= 0 && t.input != master) to_close.push_back(t.input);
        t.input = -1;
        t.pty = -1;
        for (int fd : {master, out[0], err[0]}) {
          if (fd >= 0) to_close.push_back(fd);
        }
        closed = Closed(ExitCode(status));
      }
    } else {  // tcp, instance-tcp
      bool instance = ticket.op() == "instance-tcp";
      std::optional<std::string> host = ticket.host();
      if (instance) {
        host =
            options_.instance_address ? options_.instance_address(ticket.instance()) : std::nullopt;
      }
      absl::StatusOr<int> fd =
          host ? Dial(*host, ticket.port(), instance ? nullptr : &options_.allow)
               : absl::StatusOr<int>(absl::NotFoundError(fmt::format(
                     "no instance \"{}\" in the desired state's vps section", ticket.instance())));
      if (!fd.ok()) {
        log_->Warn("tunnel.dial_failed",
                   {{"tunnel_id", t.id}, {"error", std::string(ToStd(fd.status().message()))}});
        closed = Closed(1, std::string(ToStd(fd.status().message())));
      } else {
        {
          std::lock_guard<std::mutex> lock(t.mu);
          t.socket = *fd;
          t.input = *fd;
          if (t.closing) shutdown(*fd, SHUT_RDWR);
        }
        start_reader();
        t.Pump({*fd});
        std::lock_guard<std::mutex> lock(t.mu);
        shutdown(t.socket, SHUT_RDWR);  // a reader blocked writing to it returns
        to_close.push_back(t.socket);
        t.socket = -1;
        t.input = -1;
      }
    }
    start_reader();  // a tunnel that never started still hears the operator close it
    t.Finish(closed);
    reader.join();
    for (int fd : to_close) close(fd);
    t.stream->Finish();
    log_->Info("tunnel.closed",
               {{"tunnel_id", t.id}, {"exit_code", std::to_string(closed.closed().exit_code())}});
    t.done = true;
  });
  return absl::OkStatus();
}

}  // namespace bcd
