#include "modes/node/imds.h"

// Boost 1.74 with g++ 12 in C++20 needs <utility> before the Asio headers.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <charconv>
#include <cstring>
#include <optional>
#include <sstream>
#include <utility>

#include "base/mutex.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "pki/base64url.h"
#include "proto/absl_compat.h"

namespace bcd {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
namespace v1 = bettercompute::agent::v1;
using Clock = std::chrono::steady_clock;

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

std::string Serialize(const http::response<http::string_body>& response) {
  std::ostringstream out;
  out << response;
  return out.str();
}

// The TTL header as it must be: decimal digits only, 1 to kMaxTokenTtl.
std::optional<int64_t> ParseTtl(std::string_view text) {
  int64_t ttl = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), ttl);
  if (text.empty() || text.front() == '-' || ec != std::errc() ||
      end != text.data() + text.size() || ttl < 1 || ttl > ImdsServer::kMaxTokenTtl) {
    return std::nullopt;
  }
  return ttl;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The value of query parameter `name` in `target` (percent-decoded, '+' as a space): "" when it
// is absent, nullopt when the query is malformed.
std::optional<std::string> QueryParameter(std::string_view target, std::string_view name) {
  std::size_t question = target.find('?');
  if (question == std::string_view::npos) return std::string();
  std::string_view query = target.substr(question + 1);
  std::string found;
  while (!query.empty()) {
    std::size_t amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    std::size_t equals = pair.find('=');
    if (pair.substr(0, equals) != name) continue;
    std::string_view raw = equals == std::string_view::npos ? "" : pair.substr(equals + 1);
    std::string value;
    for (std::size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] == '%') {
        if (i + 2 >= raw.size() || HexDigit(raw[i + 1]) < 0 || HexDigit(raw[i + 2]) < 0)
          return std::nullopt;
        value += static_cast<char>(HexDigit(raw[i + 1]) * 16 + HexDigit(raw[i + 2]));
        i += 2;
      } else {
        value += raw[i] == '+' ? ' ' : raw[i];
      }
    }
    found = std::move(value);
  }
  return found;
}

// Feeds `pending` to `parser`, keeping what it did not take. The answer to send when the bytes
// are refused (431 past the header bound, 400 otherwise); "" while the request is fine so far.
std::string Feed(http::request_parser<http::empty_body>& parser, std::string& pending) {
  while (!pending.empty() && !parser.is_done()) {
    beast::error_code ec;
    std::size_t used = parser.put(net::buffer(pending.data(), pending.size()), ec);
    pending.erase(0, used);
    if (ec == http::error::need_more) break;
    if (ec == http::error::header_limit) {
      return Serialize(Answer(
          http::status::request_header_fields_too_large,
          fmt::format("request headers are limited to {} bytes\n", ImdsServer::kMaxHeaderBytes)));
    }
    if (ec) return Serialize(Answer(http::status::bad_request, "a malformed request\n"));
    if (used == 0) break;
  }
  return "";
}

void Limit(http::request_parser<http::empty_body>& parser) {
  parser.header_limit(ImdsServer::kMaxHeaderBytes);
  parser.body_limit(0);
  parser.eager(true);
}

}  // namespace

struct ImdsServer::Parsed {
  http::request<http::empty_body> request;
};

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
  server->wake_fd_ = eventfd(0, EFD_CLOEXEC);
  if (server->wake_fd_ < 0) {
    return absl::InternalError(fmt::format("imds: eventfd: {}", std::strerror(errno)));
  }
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

ImdsServer::~ImdsServer() {
  stopping_ = true;
  if (wake_fd_ >= 0) {
    uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
  }
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) close(listen_fd_);
  UniqueLock lock(mu_);
  for (int fd : open_) shutdown(fd, SHUT_RDWR);  // every connection ends now
  idle_.wait(lock, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return known_ + unknown_ == 0; });
  if (wake_fd_ >= 0) close(wake_fd_);
}

void ImdsServer::Loop() {
  while (!stopping_) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0 || stopping_ || (fds[0].revents & POLLIN) == 0) continue;
    sockaddr_in peer{};
    socklen_t length = sizeof peer;
    int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&peer), &length,
                     SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &peer.sin_addr, text, sizeof text);
    std::string address = text;
    // Whose request it is decides whose slots it takes, before it takes one.
    bool known = false;
    for (const v1::VpsInstance& instance : options_.instances())
      known |= instance.address() == address;
    {
      MutexLock lock(mu_);
      int& mine = slots_[address];
      bool room = known ? known_ < kMaxConcurrent && mine < kSlotsPerSource
                        : unknown_ < kUnknownSlots && mine < 1;
      if (!room) {
        if (mine == 0) slots_.erase(address);
        Count("busy");
        close(fd);  // busy: the instance asks again
        continue;
      }
      ++mine;
      ++(known ? known_ : unknown_);
      open_.insert(fd);
    }
    // Each request on its own thread: fetching user data or a token may wait on the session (up to
    // 10 s) and must not hold up other instances.
    std::thread([this, fd, address, known] {
      Serve(fd, address, known);
      MutexLock lock(mu_);
      open_.erase(fd);
      close(fd);
      if (--slots_[address] == 0) slots_.erase(address);
      --(known ? known_ : unknown_);
      idle_.notify_all();
    }).detach();
  }
}

void ImdsServer::Serve(int fd, const std::string& peer, bool known) {
  // Waits until `fd` is ready for `events` or the deadline passes; false when it passed (or the
  // socket failed).
  auto wait = [&](short events, Clock::time_point deadline) {
    while (true) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0 || stopping_) return false;
      pollfd p{fd, events, 0};
      int ready = poll(&p, 1, static_cast<int>(left.count()));
      if (ready < 0 && errno == EINTR) continue;
      if (ready < 0) return false;
      if (ready > 0) return true;
    }
  };
  auto deadline = Clock::now() + options_.request_deadline;
  http::request_parser<http::empty_body> parser;
  Limit(parser);
  std::string pending, answer;
  char buffer[4096];
  while (!parser.is_done() && answer.empty()) {
    if (!wait(POLLIN, deadline)) {  // too slow, or stopping: closed without an answer
      Count("incomplete");
      return;
    }
    ssize_t n = read(fd, buffer, sizeof buffer);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) return;
    pending.append(buffer, static_cast<std::size_t>(n));
    answer = Feed(parser, pending);
  }
  bool hop_limit_one = false;
  if (answer.empty()) {
    if (!known) {
      LogUnknownSource(peer);
      answer = Serialize(Answer(http::status::not_found, "no instance holds this address\n"));
    } else {
      answer = Respond(Parsed{parser.release()}, peer, &hop_limit_one);
    }
  }
  Count(std::string_view(answer).substr(9, 3));  // "HTTP/1.1 200 OK": the status
  if (hop_limit_one) {
    // The answer goes no further than the next hop.
    int ttl = 1;
    setsockopt(fd, IPPROTO_IP, IP_TTL, &ttl, sizeof ttl);
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

std::string ImdsServer::AnswerBytes(std::string_view bytes, const std::string& peer) {
  http::request_parser<http::empty_body> parser;
  Limit(parser);
  std::string pending(bytes);
  std::string refused = Feed(parser, pending);
  if (!refused.empty()) return refused;
  if (!parser.is_done()) return "";
  bool hop_limit_one = false;
  return Respond(Parsed{parser.release()}, peer, &hop_limit_one);
}

void ImdsServer::LogUnknownSource(const std::string& peer) {
  int64_t now = options_.now();
  {
    MutexLock lock(mu_);
    auto [it, fresh] = unknown_logged_.try_emplace(peer, now);
    if (!fresh && now - it->second < 60) return;  // once per address and minute
    it->second = now;
    if (unknown_logged_.size() > 1024) {
      std::erase_if(unknown_logged_, [&](const auto& entry) { return now - entry.second >= 60; });
    }
  }
  log_->Warn("imds.unknown_source", {{"address", peer}});
}

std::string ImdsServer::IssueToken(const std::string& peer, int64_t ttl, int64_t now) {
  unsigned char random[32];
  RAND_bytes(random, sizeof random);
  std::string token = pki::Base64UrlEncode({reinterpret_cast<char*>(random), sizeof random});
  MutexLock lock(mu_);
  std::erase_if(tokens_, [&](const auto& entry) { return entry.second.expires <= now; });
  // An address holds at most kTokensPerSource (its oldest goes), and all of them kMaxTokens (the
  // oldest overall goes): no instance can take the tokens others need.
  auto oldest = [&](bool of_peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto found = tokens_.end();
    for (auto it = tokens_.begin(); it != tokens_.end(); ++it) {
      if (of_peer && it->second.address != peer) continue;
      if (found == tokens_.end() || it->second.issued < found->second.issued) found = it;
    }
    return found;
  };
  std::size_t mine = 0;
  for (const auto& [key, held] : tokens_) mine += held.address == peer;
  if (mine >= kTokensPerSource) tokens_.erase(oldest(true));
  if (tokens_.size() >= kMaxTokens) tokens_.erase(oldest(false));
  tokens_[token] = {peer, now + ttl, ++issued_};
  return token;
}

std::string ImdsServer::Respond(const Parsed& parsed, const std::string& peer,
                                bool* hop_limit_one) {
  const auto& request = parsed.request;
  auto reply = [](http::response<http::string_body> response) { return Serialize(response); };
  // Which instance is asking.
  std::optional<v1::VpsInstance> instance;
  for (const v1::VpsInstance& candidate : options_.instances()) {
    if (candidate.address() == peer) instance = candidate;
  }
  if (!instance) {
    LogUnknownSource(peer);
    return reply(Answer(http::status::not_found, "no instance holds this address\n"));
  }
  std::string target(request.target());
  std::string path = target.substr(0, target.find('?'));
  int64_t now = options_.now();
  if (request.method() == http::verb::put && path == "/v1/api/token") {
    if (request.find("X-Forwarded-For") != request.end() ||
        request.find(http::field::forwarded) != request.end()) {
      return reply(Answer(http::status::forbidden, "a relayed request cannot get a token\n"));
    }
    beast::string_view ttl_text = request[kTtlHeader];
    std::optional<int64_t> ttl = ParseTtl(std::string_view(ttl_text.data(), ttl_text.size()));
    if (!ttl) {
      return reply(Answer(http::status::bad_request,
                          fmt::format("{} must be 1 to {}\n", kTtlHeader, kMaxTokenTtl)));
    }
    std::string token = IssueToken(peer, *ttl, now);
    *hop_limit_one = true;
    return reply(Answer(http::status::ok, token));
  }
  if (request.method() != http::verb::get) {
    return reply(Answer(http::status::method_not_allowed, "GET, or PUT /v1/api/token\n"));
  }
  {
    std::string token(request[kTokenHeader]);
    MutexLock lock(mu_);
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
    std::optional<std::string> audience = QueryParameter(target, "audience");
    if (!audience) {
      return reply(Answer(http::status::bad_request, "the query is not well formed\n"));
    }
    absl::StatusOr<std::string> token = options_.token(*instance, *audience);
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
