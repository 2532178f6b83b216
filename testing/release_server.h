#pragma once

// The dev stack's release server: HTTPS (TLS 1.3) on 127.0.0.1 with the dev gateway's certificate
// chain, serving the files of one directory to GET, the way a release bucket serves binaries.
// bcd trusts it through SSL_CERT_FILE pointing at the dev serving CA. Plain OpenSSL on a socket,
// one thread, one request per connection.

#include <atomic>
#include <filesystem>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

struct ssl_ctx_st;

namespace bcd::testing {

class ReleaseServer {
 public:
  // Serves `dir` with the PEM key and chain (leaf first).
  static absl::StatusOr<std::unique_ptr<ReleaseServer>> Start(const std::filesystem::path& dir,
                                                              const std::string& key_pem,
                                                              const std::string& chain_pem);
  ~ReleaseServer();
  int port() const { return port_; }
  std::string Url(const std::string& name) const {
    return "https://127.0.0.1:" + std::to_string(port_) + "/" + name;
  }

 private:
  ReleaseServer() = default;
  void Loop();
  void Serve(int fd);
  std::filesystem::path dir_;
  ::ssl_ctx_st* context_ = nullptr;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace bcd::testing
