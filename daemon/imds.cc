#include "daemon/imds.h"

// Boost 1.74 with g++ 12 in C++20 needs <utility> before the Asio headers.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <sstream>
#include <utility>

#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "pki/base64url.h"
#include "proto/absl_compat.h"

namespace bcd {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
namespace v1 = bettercompute::agent::v1;

constexpr char kTokenHeader[] = "X-BC-Metadata-Token";
constexpr char kTtlHeader[] = "X-BC-Metadata-Token-TTL-Seconds";

http::response<http::string_body> Answer(http::status status, std::string body,
                                         std::string type = "text/plain") {
  http::response<http::string_body> response{status, 11};
  response.set(http::field::server, "bcd-imds");
  response.set(http::field::content_type, type);
  response.set(http::field::connection, "close");
  response.body() = std::move(body);
  response.prepare_payload();
  return response;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ImdsServer>> ImdsServer::Start(ImdsOptions options, Logger* log) {
  std::unique_ptr<ImdsServer> server(new ImdsServer(std::move(options), log));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(server->options_.port);
  if (inet_pton(AF_INET, server->options_.host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        fmt::format("imds: {} is not an IPv4 address", server->options_.host));
  }
  server->listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int on = 1;
  setsockopt(server->listen_fd_, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  if (bind(server->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(server->listen_fd_, 64) != 0) {
    int error = errno;
    close(server->listen_fd_);
    server->listen_fd_ = -1;
    return absl::UnavailableError(fmt::format("imds: cannot listen on {}:{}: {}",
                                              server->options_.host, server->options_.port,
                                              std::strerror(error)));
  }
  socklen_t length = sizeof addr;
  getsockname(server->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &length);
  server->port_ = ntohs(addr.sin_port);
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

ImdsServer::~ImdsServer() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) close(listen_fd_);
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [&] { return serving_ == 0; });  // requests in hand finish (5 s at most)
}

void ImdsServer::Loop() {
  while (!stopping_) {
    pollfd pfd{listen_fd_, POLLIN, 0};
    if (poll(&pfd, 1, 100) <= 0) continue;
    sockaddr_in peer{};
    socklen_t length = sizeof peer;
    int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &length, SOCK_CLOEXEC);
    if (fd < 0) continue;
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &peer.sin_addr, text, sizeof text);
    timeval timeout{5, 0};  // a slow client does not hold the service
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (serving_ >= kMaxConcurrent) {  // busy: the instance asks again
        close(fd);
        continue;
      }
      ++serving_;
    }
    // Each request on its own thread: fetching user data or a token may wait on the session (up to
    // 10 s) and must not hold up other instances.
    std::thread([this, fd, peer = std::string(text)] {
      Serve(fd, peer);  // closes fd
      std::lock_guard<std::mutex> lock(mu_);
      --serving_;
      idle_.notify_all();
    }).detach();
  }
}

struct ImdsServer::Parsed {
  http::request<http::empty_body> request;
};

void ImdsServer::Serve(int fd, const std::string& peer) {
  net::io_context ioc;
  tcp::socket socket(ioc);
  beast::error_code ec;
  socket.assign(tcp::v4(), fd, ec);
  if (ec) {
    close(fd);
    return;
  }
  beast::flat_buffer buffer(16 * 1024);
  http::request_parser<http::empty_body> parser;
  parser.header_limit(kMaxHeaderBytes);
  parser.body_limit(0);
  http::read(socket, buffer, parser, ec);
  if (ec) return;  // the socket closes with `socket`
  bool hop_limit_one = false;
  std::string answer = Respond(Parsed{parser.release()}, peer, &hop_limit_one);
  if (hop_limit_one) {
    // The answer goes no further than the next hop.
    int ttl = 1;
    setsockopt(socket.native_handle(), IPPROTO_IP, IP_TTL, &ttl, sizeof ttl);
  }
  net::write(socket, net::buffer(answer), ec);
}

std::string ImdsServer::AnswerBytes(std::string_view bytes, const std::string& peer) {
  http::request_parser<http::empty_body> parser;
  parser.header_limit(kMaxHeaderBytes);
  parser.body_limit(0);
  parser.eager(true);
  beast::error_code ec;
  parser.put(net::buffer(bytes.data(), bytes.size()), ec);
  if (ec || !parser.is_done()) return "";
  bool hop_limit_one = false;
  return Respond(Parsed{parser.release()}, peer, &hop_limit_one);
}

std::string ImdsServer::Respond(const Parsed& parsed, const std::string& peer,
                                bool* hop_limit_one) {
  const auto& request = parsed.request;
  auto reply = [](http::response<http::string_body> response) {
    std::ostringstream out;
    out << response;
    return out.str();
  };
  // Which instance is asking.
  std::optional<v1::VpsInstance> instance;
  for (const v1::VpsInstance& candidate : options_.instances()) {
    if (candidate.address() == peer) instance = candidate;
  }
  if (!instance) {
    log_->Warn("imds.unknown_source", {{"address", peer}});
    return reply(Answer(http::status::not_found, "no instance holds this address\n"));
  }
  std::string target(request.target());
  std::string path = target.substr(0, target.find('?'));
  int64_t now = options_.now();
  if (request.method() == http::verb::put && path == "/v1/api/token") {
    if (request.find("X-Forwarded-For") != request.end()) {
      return reply(Answer(http::status::forbidden, "a relayed request cannot get a token\n"));
    }
    std::string ttl_text(request[kTtlHeader]);
    int64_t ttl = 0;
    try {
      ttl = ttl_text.empty() ? 0 : std::stoll(ttl_text);
    } catch (...) {
      ttl = 0;
    }
    if (ttl < 1 || ttl > kMaxTokenTtl) {
      return reply(Answer(http::status::bad_request,
                          fmt::format("{} must be 1 to {}\n", kTtlHeader, kMaxTokenTtl)));
    }
    unsigned char random[32];
    RAND_bytes(random, sizeof random);
    std::string token = pki::Base64UrlEncode({reinterpret_cast<char*>(random), sizeof random});
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::erase_if(tokens_, [&](const auto& entry) { return entry.second.expires <= now; });
      if (tokens_.size() >= kMaxTokens) {
        return reply(Answer(http::status::too_many_requests, "too many tokens\n"));
      }
      tokens_[token] = {peer, now + ttl};
    }
    *hop_limit_one = true;
    return reply(Answer(http::status::ok, token));
  }
  if (request.method() != http::verb::get) {
    return reply(Answer(http::status::method_not_allowed, "GET, or PUT /v1/api/token\n"));
  }
  {
    std::string token(request[kTokenHeader]);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tokens_.find(token);
    if (token.empty() || it == tokens_.end() || it->second.address != peer ||
        it->second.expires <= now) {
      return reply(
          Answer(http::status::unauthorized,
                 fmt::format("a valid {} is required (PUT /v1/api/token)\n", kTokenHeader)));
    }
  }
  if (path == "/v1/meta-data") {
    nlohmann::json meta = {{"instance_id", instance->instance_id()},
                           {"hostname", instance->instance_id()},
                           {"addresses", nlohmann::json::array({instance->address()})}};
    return reply(Answer(http::status::ok, meta.dump(), "application/json"));
  }
  if (path == "/v1/user-data") {
    if (instance->user_data_ref().empty()) {
      return reply(Answer(http::status::not_found, "this instance has no user data\n"));
    }
    absl::StatusOr<std::string> data = options_.user_data(*instance);
    if (!data.ok()) {
      log_->Warn("imds.user_data_failed", {{"instance_id", instance->instance_id()},
                                           {"error", std::string(ToStd(data.status().message()))}});
      return reply(Answer(http::status::bad_gateway, "the user data could not be fetched\n"));
    }
    return reply(Answer(http::status::ok, *data, "application/octet-stream"));
  }
  if (path == "/v1/token") {
    std::string audience;
    if (std::size_t at = target.find("audience="); at != std::string::npos) {
      audience = target.substr(at + 9);
      audience = audience.substr(0, audience.find('&'));
    }
    absl::StatusOr<std::string> token = options_.token(*instance, audience);
    if (!token.ok()) {
      log_->Warn("imds.token_failed", {{"instance_id", instance->instance_id()},
                                       {"error", std::string(ToStd(token.status().message()))}});
      return reply(Answer(http::status::bad_gateway, "the workload token could not be fetched\n"));
    }
    return reply(Answer(http::status::ok, *token, "application/jwt"));
  }
  return reply(Answer(http::status::not_found, "no such path\n"));
}

}  // namespace bcd
