#include "testing/upload_sink.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

namespace bcd::testing {

UploadSink::UploadSink() {
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  listen(listen_fd_, 16);
  socklen_t len = sizeof addr;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { Loop(); });
}

UploadSink::~UploadSink() {
  stopping_ = true;
  thread_.join();
  close(listen_fd_);
}

std::vector<UploadSink::Request> UploadSink::requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_;
}

void UploadSink::Loop() {
  while (!stopping_) {
    pollfd pfd{listen_fd_, POLLIN, 0};
    if (poll(&pfd, 1, 50) <= 0) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Serve(fd);
    close(fd);
  }
}

void UploadSink::Serve(int fd) {
  std::string data;
  char buffer[65536];
  auto fill = [&] {
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, 10000) <= 0) return false;
    ssize_t n = read(fd, buffer, sizeof buffer);
    if (n <= 0) return false;
    data.append(buffer, static_cast<std::size_t>(n));
    return true;
  };
  std::size_t end;
  while ((end = data.find("\r\n\r\n")) == std::string::npos) {
    if (!fill()) return;
  }
  Request request;
  std::string head = data.substr(0, end);
  std::size_t line_end = head.find("\r\n");
  std::string first = head.substr(0, line_end);
  request.method = first.substr(0, first.find(' '));
  request.target = first.substr(first.find(' ') + 1);
  request.target = request.target.substr(0, request.target.find(' '));
  for (std::size_t at = line_end; at != std::string::npos && at < head.size();) {
    std::size_t next = head.find("\r\n", at + 2);
    std::string line =
        head.substr(at + 2, next == std::string::npos ? std::string::npos : next - at - 2);
    std::size_t colon = line.find(':');
    if (colon != std::string::npos) {
      std::string name = line.substr(0, colon);
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(' '));
      request.headers[name] = value;
    }
    at = next;
  }
  std::size_t length =
      std::stoul(request.headers.count("content-length") ? request.headers["content-length"]
                                                         : std::string("0"));
  data.erase(0, end + 4);
  while (data.size() < length) {
    if (!fill()) return;
  }
  request.body = data.substr(0, length);
  {
    std::lock_guard<std::mutex> lock(mu_);
    requests_.push_back(std::move(request));
  }
  while (hang_ && !stopping_) {
    pollfd pfd{fd, POLLIN, 0};
    poll(&pfd, 1, 50);
    char c;
    if ((pfd.revents & (POLLIN | POLLHUP)) != 0 && read(fd, &c, 1) <= 0) return;  // it gave up
  }
  std::string answer = "HTTP/1.1 " + std::to_string(status_.load()) +
                       " Status\r\nContent-Length: 9\r\nConnection: close\r\n\r\nsink said";
  (void)!write(fd, answer.data(), answer.size());
}

}  // namespace bcd::testing
