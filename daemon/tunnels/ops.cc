#include "daemon/tunnels/ops.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/mutex.h"
#include "fmt/format.h"
#include "proto/absl_compat.h"

namespace bcd::tunnels {

namespace v1 = bettercompute::agent::v1;

namespace {

constexpr std::size_t kChunk = 32 * 1024;

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

v1::TunnelFrame Data(uint32_t channel, const char* bytes, std::size_t size) {
  v1::TunnelFrame frame;
  frame.mutable_data()->set_channel(channel);
  frame.mutable_data()->set_data(bytes, size);
  return frame;
}

// Connects to host:port within 10 s when a rule allows the address it resolves to.
absl::StatusOr<Fd> Dial(const std::string& host, uint16_t port,
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
    Fd fd(socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) continue;
    int rc = connect(fd.get(), a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd.get(), POLLOUT, 0};
      int error = ETIMEDOUT;
      socklen_t length = sizeof error;
      if (poll(&p, 1, 10000) == 1) getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &length);
      rc = error == 0 ? 0 : -1;
      errno = error;
    }
    if (rc == 0) {
      fcntl(fd.get(), F_SETFL, fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
      int one = 1;
      setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return fd;
    }
    return absl::UnavailableError(fmt::format("{}:{}: {}", host, port, std::strerror(errno)));
  }
  if (!refused.empty()) {
    return absl::PermissionDeniedError(
        fmt::format("{}:{} ({}) is not allowed by [tunnels] allow", host, port, refused));
  }
  return absl::UnavailableError(fmt::format("{}:{}: no address to connect to", host, port));
}

// The part shell and exec share once the keeper runs: the tunnel learns the keeper and where input
// goes, the output is pumped until it ends, then the keeper is told to end everything (when the
// tunnel closed) and waited for. Returns the closed frame with the command's exit code.
v1::TunnelFrame RunKept(Tunnel& t, pid_t keeper, int input, int pty,
                        const std::vector<int>& outputs) {
  {
    MutexLock lock(t.mu);
    t.keeper = keeper;
    t.input = input;
    t.pty = pty;
    if (t.closing) kill(keeper, SIGTERM);
  }
  t.StartReader();
  t.Pump(outputs);
  {
    // The command's output ended: it exited (and the keeper killed what it left behind), or the
    // tunnel closed. Either way the keeper ends everything and exits.
    MutexLock lock(t.mu);
    if (t.closing) kill(keeper, SIGTERM);
  }
  int status = 0;
  while (waitpid(keeper, &status, 0) < 0 && errno == EINTR) {
  }
  MutexLock lock(t.mu);
  t.keeper = -1;
  t.input = -1;
  t.pty = -1;
  return Closed(ExitCode(status));
}

class ShellOp final : public TunnelOp {
 public:
  ShellOp(Account account, uint32_t rows, uint32_t cols)
      : account_(std::move(account)), rows_(rows), cols_(cols) {}

  v1::TunnelFrame Run(Tunnel& t) override {
    ChildArgs args = MakeArgs(account_, {}, /*login=*/true);
    winsize size{};
    size.ws_row = static_cast<unsigned short>(rows_ ? rows_ : 24);
    size.ws_col = static_cast<unsigned short>(cols_ ? cols_ : 80);
    int master = -1;
    // The child is the keeper (StartKept), which runs the shell below it.
    pid_t pid = forkpty(&master, nullptr, nullptr, &size);
    if (pid == 0) StartKept(account_, args, /*own_group=*/false);
    if (pid < 0) return Closed(255, fmt::format("cannot start: {}", std::strerror(errno)));
    master_.reset(master);
    fcntl(master_.get(), F_SETFD, FD_CLOEXEC);
    return RunKept(t, pid, master_.get(), master_.get(), {master_.get()});
  }

 private:
  Account account_;
  uint32_t rows_, cols_;
  Fd master_;
};

class ExecOp final : public TunnelOp {
 public:
  ExecOp(Account account, std::vector<std::string> argv)
      : account_(std::move(account)), argv_(std::move(argv)) {}

  v1::TunnelFrame Run(Tunnel& t) override {
    ChildArgs args = MakeArgs(account_, argv_, /*login=*/false);
    // Each pipe as {read end, write end}; the child's ends close here once it has them.
    Fd in[2], out[2], err[2];
    for (Fd* pipe : {in, out, err}) {
      int ends[2];
      if (pipe2(ends, O_CLOEXEC) != 0) {
        return Closed(255, fmt::format("cannot start: {}", std::strerror(errno)));
      }
      pipe[0].reset(ends[0]);
      pipe[1].reset(ends[1]);
    }
    pid_t pid = fork();
    if (pid == 0) {
      // A pipe end that landed on 0..2 (bcd started with a standard fd closed) is moved out of
      // the way first, so one dup2 cannot overwrite another's source.
      int fds[3] = {in[0].get(), out[1].get(), err[1].get()};
      for (int& fd : fds) {
        if (fd < 3) fd = fcntl(fd, F_DUPFD, 3);
      }
      for (int i = 0; i < 3; ++i) dup2(fds[i], i);
      StartKept(account_, args, /*own_group=*/true);
    }
    if (pid < 0) return Closed(255, fmt::format("cannot start: {}", std::strerror(errno)));
    in[0].reset();
    out[1].reset();
    err[1].reset();
    stdout_ = std::move(out[0]);
    stderr_ = std::move(err[0]);
    int input = in[1].get();
    {
      MutexLock lock(t.mu);
      t.stdin_pipe = std::move(in[1]);
    }
    return RunKept(t, pid, input, -1, {stdout_.get(), stderr_.get()});
  }

 private:
  Account account_;
  std::vector<std::string> argv_;
  Fd stdout_, stderr_;
};

class TcpOp final : public TunnelOp {
 public:
  TcpOp(absl::StatusOr<std::string> host, uint16_t port, const std::vector<TunnelAllowRule>* allow,
        Logger* log)
      : host_(std::move(host)), port_(port), allow_(allow), log_(log) {}

  v1::TunnelFrame Run(Tunnel& t) override {
    absl::StatusOr<Fd> fd = host_.ok() ? Dial(*host_, port_, allow_) : host_.status();
    if (!fd.ok()) {
      std::string why(ToStd(fd.status().message()));
      log_->Warn("tunnel.dial_failed", {{"tunnel_id", t.id}, {"error", why}});
      return Closed(1, why);
    }
    socket_ = *std::move(fd);
    {
      MutexLock lock(t.mu);
      t.socket = socket_.get();
      t.input = socket_.get();
      if (t.closing) shutdown(socket_.get(), SHUT_RDWR);
    }
    t.StartReader();
    t.Pump({socket_.get()});
    MutexLock lock(t.mu);
    shutdown(socket_.get(), SHUT_RDWR);  // a reader blocked writing to it returns
    t.socket = -1;
    t.input = -1;
    return Closed(0);
  }

 private:
  absl::StatusOr<std::string> host_;
  uint16_t port_;
  const std::vector<TunnelAllowRule>* allow_;
  Logger* log_;
  Fd socket_;
};

}  // namespace

v1::TunnelFrame Closed(int exit_code, std::string reason) {
  v1::TunnelFrame frame;
  frame.mutable_closed()->set_exit_code(exit_code);
  frame.mutable_closed()->set_reason(std::move(reason));
  return frame;
}

std::unique_ptr<TunnelOp> MakeShellOp(Account account, uint32_t rows, uint32_t cols) {
  return std::make_unique<ShellOp>(std::move(account), rows, cols);
}

std::unique_ptr<TunnelOp> MakeExecOp(Account account, std::vector<std::string> argv) {
  return std::make_unique<ExecOp>(std::move(account), std::move(argv));
}

std::unique_ptr<TunnelOp> MakeTcpOp(absl::StatusOr<std::string> host, uint16_t port,
                                    const std::vector<TunnelAllowRule>* allow, Logger* log) {
  return std::make_unique<TcpOp>(std::move(host), port, allow, log);
}

void Tunnel::Stop() {
  MutexLock lock(mu);
  closing = true;
  if (keeper > 0) kill(keeper, SIGTERM);
  if (socket >= 0) shutdown(socket, SHUT_RDWR);
}

void Tunnel::StartReader() {
  if (!reader_.joinable()) reader_ = std::thread([this] { ReadStream(); });
}

void Tunnel::ReadStream() {
  v1::TunnelFrame frame;
  while (stream->Read(&frame)) {
    if (frame.has_data() && frame.data().channel() == 0) {
      int fd;
      bool is_socket;
      {
        MutexLock lock(mu);
        fd = input;
        is_socket = socket >= 0 && input == socket;
      }
      if (fd < 0) continue;
      if (frame.data().data().empty()) {
        // End of input: EOF on stdin, or a half-close of the connection.
        MutexLock lock(mu);
        if (is_socket) {
          shutdown(input, SHUT_WR);
        } else if (stdin_pipe && input == stdin_pipe.get()) {
          stdin_pipe.reset();
          input = -1;
        }
        continue;
      }
      // Blocks while the other end does not read: flow control reaches the gateway.
      if (!WriteAll(fd, frame.data().data().data(), frame.data().data().size())) continue;
    } else if (frame.has_resize()) {
      MutexLock lock(mu);
      if (pty >= 0) {
        winsize size{};
        size.ws_row = static_cast<unsigned short>(std::min<uint32_t>(frame.resize().rows(), 1000));
        size.ws_col = static_cast<unsigned short>(std::min<uint32_t>(frame.resize().cols(), 1000));
        ioctl(pty, TIOCSWINSZ, &size);
      }
    } else if (frame.has_closed()) {
      break;
    }
  }
  Stop();
  MutexLock lock(mu);
  reader_done = true;
  cv.notify_all();
}

void Tunnel::Pump(const std::vector<int>& fds) {
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
      MutexLock lock(mu);
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

void Tunnel::Finish(const v1::TunnelFrame& closed) {
  StartReader();  // a tunnel whose op never started still hears the operator close it
  stream->Write(closed);
  stream->CloseSend();
  {
    UniqueLock lock(mu);
    if (!cv.wait_for(lock, std::chrono::seconds(5),
                     [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return reader_done; })) {
      lock.unlock();
      stream->Cancel();
    }
  }
  reader_.join();
  MutexLock lock(mu);
  stdin_pipe.reset();
}

}  // namespace bcd::tunnels
