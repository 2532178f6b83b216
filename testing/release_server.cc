#include "testing/release_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>

#include "fmt/format.h"

namespace bcd::testing {
namespace {

// Loads the key and chain (leaf first) into `context`.
bool LoadIdentity(SSL_CTX* context, const std::string& key_pem, const std::string& chain_pem) {
  std::unique_ptr<BIO, decltype(&BIO_free)> key_bio(
      BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size())), BIO_free);
  EVP_PKEY* key = PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr);
  if (key == nullptr) return false;
  bool ok = SSL_CTX_use_PrivateKey(context, key) == 1;
  EVP_PKEY_free(key);
  std::unique_ptr<BIO, decltype(&BIO_free)> chain_bio(
      BIO_new_mem_buf(chain_pem.data(), static_cast<int>(chain_pem.size())), BIO_free);
  bool first = true;
  while (X509* cert = PEM_read_bio_X509(chain_bio.get(), nullptr, nullptr, nullptr)) {
    ok = ok && (first ? SSL_CTX_use_certificate(context, cert) == 1
                      : SSL_CTX_add1_chain_cert(context, cert) == 1);
    X509_free(cert);
    first = false;
  }
  ERR_clear_error();
  return ok && !first;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ReleaseServer>> ReleaseServer::Start(
    const std::filesystem::path& dir, const std::string& key_pem, const std::string& chain_pem) {
  std::unique_ptr<ReleaseServer> server(new ReleaseServer());
  server->dir_ = dir;
  server->context_ = SSL_CTX_new(TLS_server_method());
  SSL_CTX_set_min_proto_version(server->context_, TLS1_3_VERSION);
  if (!LoadIdentity(server->context_, key_pem, chain_pem))
    return absl::InternalError("release server: cannot load its key and certificate");
  server->listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(server->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(server->listen_fd_, 16) != 0) {
    return absl::InternalError(fmt::format("release server: cannot listen: {}", strerror(errno)));
  }
  socklen_t len = sizeof addr;
  getsockname(server->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  server->port_ = ntohs(addr.sin_port);
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

ReleaseServer::~ReleaseServer() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) close(listen_fd_);
  SSL_CTX_free(context_);
}

void ReleaseServer::Loop() {
  while (!stopping_) {
    pollfd pfd{listen_fd_, POLLIN, 0};
    if (poll(&pfd, 1, 50) <= 0) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    timeval timeout{10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
    Serve(fd);
    close(fd);
  }
}

void ReleaseServer::Serve(int fd) {
  std::unique_ptr<SSL, decltype(&SSL_free)> ssl(SSL_new(context_), SSL_free);
  SSL_set_fd(ssl.get(), fd);
  if (SSL_accept(ssl.get()) != 1) {
    ERR_clear_error();
    return;
  }
  std::string head;
  char buffer[16384];
  while (head.find("\r\n\r\n") == std::string::npos && head.size() < 16384) {
    int n = SSL_read(ssl.get(), buffer, sizeof buffer);
    if (n <= 0) return;
    head.append(buffer, static_cast<std::size_t>(n));
  }
  auto send = [&](const std::string& text) {
    return SSL_write(ssl.get(), text.data(), static_cast<int>(text.size())) > 0;
  };
  std::string line = head.substr(0, head.find("\r\n"));
  std::string name;
  if (line.starts_with("GET /") && line.find(' ', 5) != std::string::npos)
    name = line.substr(5, line.find(' ', 5) - 5);
  bool plain = !name.empty() && name.find('/') == std::string::npos && name[0] != '.';
  std::ifstream file(dir_ / name, std::ios::binary);
  if (!plain || !file) {
    send("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    SSL_shutdown(ssl.get());
    return;
  }
  file.seekg(0, std::ios::end);
  auto size = static_cast<uint64_t>(file.tellg());
  file.seekg(0);
  if (!send(fmt::format("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: "
                        "application/octet-stream\r\nConnection: close\r\n\r\n",
                        size))) {
    return;
  }
  while (file && !stopping_) {
    file.read(buffer, sizeof buffer);
    std::streamsize n = file.gcount();
    if (n <= 0) break;
    if (SSL_write(ssl.get(), buffer, static_cast<int>(n)) <= 0) return;
  }
  SSL_shutdown(ssl.get());
}

}  // namespace bcd::testing
