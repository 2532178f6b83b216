#include "daemon/diag.h"

// Boost 1.74 with g++ 12 in C++20 needs <utility> before the Asio headers.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utility>
//
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstring>
#include <sstream>

#include "base/metrics.h"
#include "base/net.h"
#include "fmt/format.h"
#include "proto/absl_compat.h"

namespace bcd {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using Clock = std::chrono::steady_clock;

std::string Answer(http::status status, std::string body, bool head,
                   std::string_view type = "text/plain; charset=utf-8") {
  http::response<http::string_body> response{status, 11};
  response.set(http::field::server, "bcd-diag");
  response.set(http::field::content_type, beast::string_view(type.data(), type.size()));
  response.set(http::field::cache_control, "no-store");
  response.set(http::field::connection, "close");
  response.body() = std::move(body);
  response.prepare_payload();
  if (head) response.body().clear();  // Content-Length stays: what GET would send
  std::ostringstream out;
  out << response;
  return out.str();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DiagServer>> DiagServer::Start(DiagOptions options, Logger* log) {
  std::unique_ptr<DiagServer> server(new DiagServer(std::move(options)));
  absl::StatusOr<Listening> listening =
      ListenTcp("diag", server->options_.listen.host, server->options_.listen.port, 16);
  if (!listening.ok()) return listening.status();
  server->listen_fd_ = listening->fd.release();
  server->port_ = listening->port;
  server->wake_fd_ = eventfd(0, EFD_CLOEXEC);
  if (server->wake_fd_ < 0) {
    return absl::InternalError(fmt::format("diag: eventfd: {}", std::strerror(errno)));
  }
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  log->Info("diag.listening",
            {{"address", server->options_.listen.host}, {"port", std::to_string(server->port_)}});
  return server;
}

DiagServer::~DiagServer() {
  stopping_ = true;
  if (wake_fd_ >= 0) {
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
  }
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) close(listen_fd_);
  UniqueLock lock(mu_);
  for (int fd : open_) shutdown(fd, SHUT_RDWR);  // every request ends now
  idle_.wait(lock, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return open_.empty(); });
  if (wake_fd_ >= 0) close(wake_fd_);
}

void DiagServer::Loop() {
  while (!stopping_) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0 || stopping_ || (fds[0].revents & POLLIN) == 0) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    {
      MutexLock lock(mu_);
      if (open_.size() >= kMaxConnections) {
        close(fd);  // busy: the scraper asks again
        continue;
      }
      open_.insert(fd);
    }
    std::thread([this, fd] {
      Serve(fd);
      MutexLock lock(mu_);
      open_.erase(fd);
      close(fd);
      idle_.notify_all();
    }).detach();
  }
}

void DiagServer::Serve(int fd) const {
  // Waits until `fd` is ready for `events`; false once the deadline passed or the socket failed.
  auto wait = [&](short events, Clock::time_point deadline) {
    while (true) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0 || stopping_) return false;
      pollfd p{fd, events, 0};
      int ready = poll(&p, 1, static_cast<int>(left.count()));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) return false;
      return true;
    }
  };
  auto deadline = Clock::now() + options_.request_deadline;
  std::string received, answer;
  char buffer[4096];
  while (answer.empty()) {
    if (!wait(POLLIN, deadline)) return;  // too slow, or stopping: closed without an answer
    ssize_t n = read(fd, buffer, sizeof buffer);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) return;
    received.append(buffer, static_cast<std::size_t>(n));
    answer = AnswerBytes(received);
  }
  deadline = Clock::now() + options_.request_deadline;
  for (std::size_t sent = 0; sent < answer.size();) {
    ssize_t n = send(fd, answer.data() + sent, answer.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!wait(POLLOUT, deadline)) return;
      continue;
    }
    if (n <= 0) return;
    sent += static_cast<std::size_t>(n);
  }
}

std::string DiagServer::AnswerBytes(std::string_view bytes) const {
  http::request_parser<http::empty_body> parser;
  parser.header_limit(kMaxHeaderBytes);
  parser.body_limit(0);
  parser.eager(true);
  beast::error_code ec;
  std::size_t used = 0;
  while (used < bytes.size() && !parser.is_done()) {
    std::size_t n = parser.put(net::buffer(bytes.data() + used, bytes.size() - used), ec);
    used += n;
    if (ec == http::error::need_more) {
      if (bytes.size() > kMaxHeaderBytes + 64)
        ec = http::error::header_limit;  // never whole
      else
        return "";
    }
    if (ec == http::error::header_limit) {
      return Answer(http::status::request_header_fields_too_large,
                    fmt::format("request headers are limited to {} bytes\n", kMaxHeaderBytes),
                    false);
    }
    if (ec) return Answer(http::status::bad_request, "a malformed request\n", false);
    if (n == 0) break;
  }
  if (!parser.is_done()) return "";
  const auto& request = parser.get();
  bool head = request.method() == http::verb::head;
  if (request.method() != http::verb::get && !head) {
    return Answer(http::status::method_not_allowed, "GET or HEAD\n", false);
  }
  std::string_view target(request.target().data(), request.target().size());
  std::string_view path = target.substr(0, target.find('?'));
  if (path == "/metrics") {
    return Answer(http::status::ok, options_.metrics(), head, Metrics::kContentType);
  }
  if (path == "/healthz" || path == "/readyz") {
    absl::Status status = path == "/healthz" ? options_.healthy() : options_.ready();
    if (status.ok()) return Answer(http::status::ok, path == "/healthz" ? "ok\n" : "ready\n", head);
    return Answer(http::status::service_unavailable, std::string(ToStd(status.message())) + "\n",
                  head);
  }
  return Answer(http::status::not_found, "no such path: /metrics, /healthz or /readyz\n", head);
}

}  // namespace bcd
