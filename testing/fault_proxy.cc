#include "testing/fault_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace bcd::testing {
namespace {

sockaddr_in Loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}

}  // namespace

absl::StatusOr<std::unique_ptr<FaultProxy>> FaultProxy::Start(int upstream_port) {
  std::unique_ptr<FaultProxy> proxy(new FaultProxy());
  proxy->upstream_port_ = upstream_port;
  proxy->listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr = Loopback(0);
  socklen_t length = sizeof addr;
  if (proxy->listen_fd_ < 0 ||
      bind(proxy->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(proxy->listen_fd_, 16) != 0 ||
      getsockname(proxy->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
    return absl::InternalError(std::string("fault proxy: ") + std::strerror(errno));
  }
  proxy->port_ = ntohs(addr.sin_port);
  proxy->acceptor_ = std::thread([p = proxy.get()] { p->AcceptLoop(); });
  return proxy;
}

FaultProxy::~FaultProxy() {
  stopping_ = true;
  shutdown(listen_fd_, SHUT_RDWR);
  acceptor_.join();
  Reset();
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
  close(listen_fd_);
}

void FaultProxy::Reset() {
  std::lock_guard<std::mutex> lock(mu_);
  for (int fd : open_fds_) {
    linger hard{1, 0};  // close with a RST
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
    shutdown(fd, SHUT_RDWR);
  }
}

void FaultProxy::AcceptLoop() {
  while (!stopping_) {
    int client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) {
      if (stopping_) return;
      continue;
    }
    int upstream = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr = Loopback(upstream_port_);
    if (connect(upstream, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      close(client);
      close(upstream);
      continue;
    }
    ++connections_;
    std::lock_guard<std::mutex> lock(mu_);
    open_fds_.push_back(client);
    open_fds_.push_back(upstream);
    threads_.emplace_back([this, client, upstream] { Pump(client, upstream); });
  }
}

void FaultProxy::Pump(int client, int upstream) {
  char buffer[16384];
  while (!stopping_) {
    if (stalled_) {
      // Move nothing and read nothing: the peers' buffers fill and no RST is sent.
      pollfd none{};
      poll(&none, 0, 20);
      continue;
    }
    pollfd fds[2] = {{client, POLLIN, 0}, {upstream, POLLIN, 0}};
    if (poll(fds, 2, 50) <= 0) continue;
    bool closed = false;
    for (int i = 0; i < 2 && !closed; ++i) {
      if (fds[i].revents == 0) continue;
      ssize_t n = read(fds[i].fd, buffer, sizeof buffer);
      if (n <= 0) {
        closed = true;
        break;
      }
      int to = i == 0 ? upstream : client;
      for (ssize_t sent = 0; sent < n;) {
        ssize_t m = send(to, buffer + sent, static_cast<std::size_t>(n - sent), MSG_NOSIGNAL);
        if (m <= 0) {
          closed = true;
          break;
        }
        sent += m;
      }
    }
    if (closed) break;
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (int fd : {client, upstream}) {
    open_fds_.erase(std::remove(open_fds_.begin(), open_fds_.end(), fd), open_fds_.end());
    close(fd);
  }
}

}  // namespace bcd::testing
