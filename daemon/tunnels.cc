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
#include <sys/socket.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

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
  for (int s : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT}) signal(s, SIG_DFL);
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
  pid_t group = -1;          // guarded by mu: the process group to kill on close
  int socket = -1;           // guarded by mu: the tcp socket to shut down on close
  int input = -1;            // guarded by mu: where channel 0 goes (stdin pipe, PTY, socket)
  int pty = -1;              // guarded by mu: for resize

  // The other side is gone or asked to close: stop what runs here.
  void Stop() {
    std::lock_guard<std::mutex> lock(mu);
    closing = true;
    if (group > 0) kill(-group, SIGKILL);
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
        if (closing && group <= 0 && socket < 0) return;
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
  std::string jwks = options_.jwks ? options_.jwks() : "";
  if (jwks.empty()) {
    return Refuse(id, "no tunnel keys: the desired state's access section has no tunnel_jwks");
  }
  int64_t now = options_.now();
  absl::StatusOr<pki::TunnelTicket> ticket = pki::TunnelTicket::Verify(
      open.ticket(), jwks,
      {.node_id = options_.node_id, .session_id = session_id, .tunnel_id = id, .now = now});
  if (!ticket.ok()) return Refuse(id, std::string(ToStd(ticket.status().message())));
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
    if (tunnels_.size() >= options_.max) {
      return Refuse(
          id, fmt::format("{} tunnels are open, the most [tunnels] max allows", tunnels_.size()));
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
      if (shell) {
        winsize size{};
        size.ws_row = ticket.rows() ? ticket.rows() : 24;
        size.ws_col = ticket.cols() ? ticket.cols() : 80;
        pid = forkpty(&master, nullptr, nullptr, &size);
        if (pid == 0) ExecChild(*account, args);
        if (master >= 0) fcntl(master, F_SETFD, FD_CLOEXEC);
      } else if (pipe2(in, O_CLOEXEC) == 0 && pipe2(out, O_CLOEXEC) == 0 &&
                 pipe2(err, O_CLOEXEC) == 0) {
        pid = fork();
        if (pid == 0) {
          setpgid(0, 0);
          // A pipe end that landed on 0..2 (bcd started with a standard fd closed) is moved out
          // of the way first, so one dup2 cannot overwrite another's source.
          int fds[3] = {in[0], out[1], err[1]};
          for (int& fd : fds) {
            if (fd < 3) fd = fcntl(fd, F_DUPFD, 3);
          }
          for (int i = 0; i < 3; ++i) dup2(fds[i], i);
          ExecChild(*account, args);
        }
      }
      if (pid < 0) {
        closed = Closed(255, fmt::format("cannot start: {}", std::strerror(errno)));
      } else {
        if (!shell) setpgid(pid, pid);  // both sides set it: no window where it is unset
        for (int fd : {in[0], out[1], err[1]}) {
          if (fd >= 0) close(fd);
        }
        {
          std::lock_guard<std::mutex> lock(t.mu);
          t.group = pid;
          t.input = shell ? master : in[1];
          t.pty = master;
          if (t.closing) kill(-pid, SIGKILL);
        }
        start_reader();
        t.Pump(shell ? std::vector<int>{master} : std::vector<int>{out[0], err[0]});
        int status = 0;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        std::lock_guard<std::mutex> lock(t.mu);
        kill(-pid, SIGKILL);  // whatever it left behind goes with it
        t.group = -1;
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
