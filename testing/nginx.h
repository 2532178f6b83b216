#pragma once

// Debian's nginx as a file server for tests and benchmarks (boot images by URL, the boot server's
// side-by-side figures, site.httpProxy's destinations): one process (no master), its files in a
// directory of its own, serving `root` on 127.0.0.1 over http, or https with a certificate made
// for it. Stops (killed) when the object goes.

#include <sys/types.h>

#include <filesystem>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace bcd::testing {

class Nginx {
 public:
  struct Options {
    std::filesystem::path root;  // what it serves
    bool tls = false;            // https with a self-signed certificate for 127.0.0.1 (cert())
    std::string extra;           // more directives for the server block
  };
  static absl::StatusOr<std::unique_ptr<Nginx>> Start(const std::filesystem::path& dir,
                                                      Options options);
  ~Nginx();

  int port() const { return port_; }
  std::string url() const;  // http(s)://127.0.0.1:port
  const std::filesystem::path& cert() const { return cert_; }
  // Whether the nginx binary is there (the tests that need it fail, never skip, without it).
  static bool Installed();

 private:
  Nginx() = default;
  pid_t pid_ = -1;
  int port_ = 0;
  bool tls_ = false;
  std::filesystem::path cert_;
};

}  // namespace bcd::testing
