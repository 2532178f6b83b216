#include "testing/nginx.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "base/files.h"
#include "fmt/format.h"
#include "testing/child_process.h"

namespace bcd::testing {
namespace {

constexpr char kNginx[] = "/usr/sbin/nginx";

std::string ReadAll(const std::filesystem::path& path) {
  return ReadWholeFile(path, std::size_t{1} << 30).value_or("");
}

}  // namespace

bool Nginx::Installed() { return access(kNginx, X_OK) == 0; }

std::string Nginx::url() const {
  return fmt::format("{}://127.0.0.1:{}", tls_ ? "https" : "http", port_);
}

absl::StatusOr<std::unique_ptr<Nginx>> Nginx::Start(const std::filesystem::path& dir,
                                                    Options options) {
  if (!Installed()) return absl::FailedPreconditionError("nginx is not installed (Debian: nginx)");
  std::filesystem::create_directories(dir / "tmp");
  auto server = std::unique_ptr<Nginx>(new Nginx());
  server->tls_ = options.tls;
  std::string tls_lines;
  if (options.tls) {
    server->cert_ = dir / "cert.pem";
    Ran made = RunShell(fmt::format(
        "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 "
        "-subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 -keyout {} -out {} 2>&1",
        (dir / "key.pem").string(), server->cert_.string()));
    if (made.status != 0) return absl::InternalError("openssl req: " + made.out);
    tls_lines = fmt::format(
        "    ssl_certificate {};\n    ssl_certificate_key {};\n    ssl_protocols TLSv1.3;\n",
        server->cert_.string(), (dir / "key.pem").string());
  }
  // A port bound and released may be taken before nginx binds it: a few tries.
  for (int attempt = 0; attempt < 5; ++attempt) {
    server->port_ = FreeLoopbackPort();
    std::string tmp = (dir / "tmp").string();
    std::string config = fmt::format(
        "daemon off;\nmaster_process off;\nworker_processes 1;\nuser root;\n"
        "pid {dir}/nginx.pid;\nerror_log {dir}/error.log warn;\n"
        "events {{ worker_connections 1024; }}\n"
        "http {{\n  access_log off;\n  sendfile on;\n  tcp_nopush on;\n"
        "  client_body_temp_path {tmp}/body;\n  proxy_temp_path {tmp}/proxy;\n"
        "  fastcgi_temp_path {tmp}/fastcgi;\n  uwsgi_temp_path {tmp}/uwsgi;\n"
        "  scgi_temp_path {tmp}/scgi;\n  types {{ application/octet-stream bin; }}\n"
        "  default_type application/octet-stream;\n"
        "  server {{\n    listen 127.0.0.1:{port}{ssl};\n    root {root};\n{tls}{extra}\n  "
        "}}\n}}\n",
        fmt::arg("dir", dir.string()), fmt::arg("tmp", tmp), fmt::arg("port", server->port_),
        fmt::arg("ssl", options.tls ? " ssl" : ""), fmt::arg("root", options.root.string()),
        fmt::arg("tls", tls_lines), fmt::arg("extra", options.extra));
    std::ofstream(dir / "nginx.conf", std::ios::trunc) << config;
    server->pid_ =
        SpawnChild({"sh", "-c",
                    fmt::format("exec {} -p {} -c {} 2>>{}", kNginx, dir.string(),
                                (dir / "nginx.conf").string(), (dir / "stderr.log").string())});
    if (server->pid_ <= 0) return absl::InternalError("cannot start nginx");
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      if (waitpid(server->pid_, nullptr, WNOHANG) == server->pid_) {
        server->pid_ = -1;
        break;  // the port was taken, or the config is wrong: try again, then say which
      }
      int fd = ConnectLoopback(static_cast<uint16_t>(server->port_));
      if (fd >= 0) {
        close(fd);
        return server;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (server->pid_ > 0) {
      kill(server->pid_, SIGKILL);
      WaitChild(server->pid_, std::chrono::seconds(10));
      server->pid_ = -1;
    }
  }
  return absl::InternalError("nginx did not start: " + ReadAll(dir / "error.log") +
                             ReadAll(dir / "stderr.log"));
}

Nginx::~Nginx() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  WaitChild(pid_, std::chrono::seconds(10));
}

}  // namespace bcd::testing
