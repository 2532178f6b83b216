#include "daemon/control.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "fmt/format.h"

namespace bcd {
namespace {

absl::StatusOr<sockaddr_un> Address(const std::filesystem::path& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.string().size() >= sizeof addr.sun_path) {
    return absl::InvalidArgumentError(
        fmt::format("control socket path {} is too long", path.string()));
  }
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  return addr;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ControlServer>> ControlServer::Start(
    const std::filesystem::path& path, std::function<std::string()> render) {
  absl::StatusOr<sockaddr_un> addr = Address(path);
  if (!addr.ok()) return addr.status();
  std::unique_ptr<ControlServer> server(new ControlServer());
  server->path_ = path;
  server->render_ = std::move(render);
  server->listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  server->stop_fd_ = eventfd(0, EFD_CLOEXEC);
  unlink(path.c_str());  // a socket left by a daemon that died
  // Created 0600 from the start: no window in which another user could connect.
  mode_t old_mask = umask(0177);
  int bound = bind(server->listen_fd_, reinterpret_cast<const sockaddr*>(&*addr), sizeof *addr);
  umask(old_mask);
  if (server->listen_fd_ < 0 || server->stop_fd_ < 0 || bound != 0 ||
      listen(server->listen_fd_, 8) != 0) {
    return absl::InternalError(
        fmt::format("cannot listen on {}: {}", path.string(), std::strerror(errno)));
  }
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

ControlServer::~ControlServer() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    (void)!write(stop_fd_, &one, sizeof one);
    thread_.join();
  }
  if (listen_fd_ >= 0) close(listen_fd_);
  if (stop_fd_ >= 0) close(stop_fd_);
  unlink(path_.c_str());
}

void ControlServer::Loop() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    int client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    std::string text = render_();
    for (std::size_t sent = 0; sent < text.size();) {
      ssize_t n = send(client, text.data() + sent, text.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<std::size_t>(n);
    }
    close(client);
  }
}

absl::StatusOr<std::string> QueryControl(const std::filesystem::path& path) {
  absl::StatusOr<sockaddr_un> addr = Address(path);
  if (!addr.ok()) return addr.status();
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof *addr) != 0) {
    if (fd >= 0) close(fd);
    return absl::UnavailableError(fmt::format("no daemon answers on {}", path.string()));
  }
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  std::string out;
  char buffer[4096];
  for (ssize_t n; (n = read(fd, buffer, sizeof buffer)) > 0 && out.size() < (1 << 20);) {
    out.append(buffer, static_cast<std::size_t>(n));
  }
  close(fd);
  return out;
}

}  // namespace bcd
