#include "modes/site/boot_server.h"

// Boost 1.74 with g++ 12 in C++20 needs <utility> before the Asio headers.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utility>
//
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <charconv>
#include <cstring>
#include <sstream>

#include "base/fd.h"
#include "base/net.h"
#include "bettercompute/agent/v1/ramdisk.pb.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "pki/base64url.h"
#include "pki/keys.h"
#include "proto/absl_compat.h"
#include "proto/signing_input.h"

namespace bcd {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using Clock = std::chrono::steady_clock;

// An answer: its head and in-memory body, then `length` bytes of `file` from `offset`.
struct BootServer::Reply {
  std::string head, body;
  Fd file;
  uint64_t offset = 0, length = 0;
  // For the access log and the counters.
  unsigned status = 0;
  std::string what = "other", mac, entry;
};

namespace {

// The head of an answer with `status` (Content-Length is `length`, or the body's size).
std::string Head(http::status status, std::string_view type, uint64_t length,
                 const std::vector<std::pair<std::string, std::string>>& extra = {}) {
  beast::string_view reason = http::obsolete_reason(status);
  std::string head =
      fmt::format("HTTP/1.1 {} {}\r\nServer: bcd-boot\r\nConnection: close\r\n",
                  static_cast<unsigned>(status), std::string_view(reason.data(), reason.size()));
  if (!type.empty()) head += fmt::format("Content-Type: {}\r\n", type);
  head += fmt::format("Content-Length: {}\r\n", length);
  for (const auto& [name, value] : extra) head += fmt::format("{}: {}\r\n", name, value);
  return head + "\r\n";
}

BootServer::Reply Text(http::status status, std::string body, bool head_only = false,
                       std::string_view type = "text/plain; charset=utf-8") {
  BootServer::Reply reply;
  reply.status = static_cast<unsigned>(status);
  reply.head = Head(status, type, body.size());
  if (!head_only) reply.body = std::move(body);
  return reply;
}

std::string PeerOf(const sockaddr_storage& storage) {
  char text[INET6_ADDRSTRLEN] = {};
  if (storage.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, text,
              sizeof text);
  } else if (storage.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, text,
              sizeof text);
  }
  return text;
}

// A single byte range of a file of `size` bytes: (offset, length); nullopt when the header is
// not one range this server honours (the whole file is sent); {size, 0} when unsatisfiable.
std::optional<std::pair<uint64_t, uint64_t>> RangeOf(std::string_view header, uint64_t size) {
  if (!header.starts_with("bytes=")) return std::nullopt;
  std::string_view spec = header.substr(6);
  if (spec.find(',') != std::string_view::npos) return std::nullopt;  // several: the whole file
  std::size_t dash = spec.find('-');
  if (dash == std::string_view::npos) return std::nullopt;
  auto number = [](std::string_view text) -> std::optional<uint64_t> {
    uint64_t value = 0;
    if (text.empty()) return std::nullopt;
    auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
    return value;
  };
  std::string_view first = spec.substr(0, dash), last = spec.substr(dash + 1);
  if (first.empty()) {  // the last N bytes
    std::optional<uint64_t> n = number(last);
    if (!n) return std::nullopt;
    if (*n == 0 || size == 0) return std::pair{size, uint64_t{0}};
    uint64_t length = std::min(*n, size);
    return std::pair{size - length, length};
  }
  std::optional<uint64_t> start = number(first);
  if (!start) return std::nullopt;
  std::optional<uint64_t> end = last.empty() ? std::optional<uint64_t>(UINT64_MAX) : number(last);
  if (!end || *end < *start) return std::nullopt;
  if (*start >= size) return std::pair{size, uint64_t{0}};
  return std::pair{*start, std::min(*end, size - 1) - *start + 1};
}

}  // namespace

BootServer::BootServer(BootServerOptions options, Logger* log)
    : options_(std::move(options)), log_(log) {
  if (options_.metrics != nullptr) {
    requests_ = &options_.metrics->Counter("bcd_boot_requests_total",
                                           "Boot-server requests, by what was asked and the answer",
                                           {"what", "status"});
    bytes_ = options_.metrics
                 ->Counter("bcd_boot_sent_bytes_total", "Bytes the boot server sent in answers")
                 .Bind({});
  }
  if (!options_.nonce) options_.nonce = [] { return pki::RandomBytes(16); };
}

absl::StatusOr<std::unique_ptr<BootServer>> BootServer::Start(BootServerOptions options,
                                                              Logger* log) {
  if (options.entries == nullptr || !options.sign || !options.now)
    return absl::FailedPreconditionError("boot server: entries, a signer and a clock are needed");
  std::unique_ptr<BootServer> server(new BootServer(std::move(options), log));
  absl::StatusOr<Listening> listening =
      ListenTcp("boot", server->options_.listen.host, server->options_.listen.port, 128);
  if (!listening.ok()) return listening.status();
  server->listen_fd_ = listening->fd.release();
  server->port_ = listening->port;
  server->wake_fd_ = eventfd(0, EFD_CLOEXEC);
  if (server->wake_fd_ < 0) {
    return absl::InternalError(fmt::format("boot: eventfd: {}", std::strerror(errno)));
  }
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  log->Info("boot.listening", {{"address", server->options_.listen.host},
                               {"port", std::to_string(server->port_)},
                               {"url", server->options_.url}});
  return server;
}

BootServer::~BootServer() {
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

void BootServer::Loop() {
  while (!stopping_) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0 || stopping_ || (fds[0].revents & POLLIN) == 0) continue;
    sockaddr_storage storage{};
    socklen_t length = sizeof storage;
    int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&storage), &length,
                     SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    std::string peer = PeerOf(storage);
    bool busy = false;
    {
      MutexLock lock(mu_);
      busy = open_.size() >= static_cast<std::size_t>(kMaxConnections);
      if (!busy) open_.insert(fd);
    }
    if (busy) {  // told at once, so a booting machine's firmware retries rather than waits
      std::string answer =
          Head(http::status::service_unavailable, "text/plain", 0, {{"Retry-After", "1"}});
      (void)!send(fd, answer.data(), answer.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      close(fd);
      if (requests_ != nullptr) requests_->Add({"other", "busy"});
      continue;
    }
    std::thread([this, fd, peer] {
      Serve(fd, peer);
      MutexLock lock(mu_);
      open_.erase(fd);
      close(fd);
      idle_.notify_all();
    }).detach();
  }
}

void BootServer::Serve(int fd, const std::string& peer) {
  // Waits until `fd` is ready for `events`; false once the deadline passed or the socket failed.
  auto wait = [&](short events, Clock::time_point deadline) {
    while (true) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0 || stopping_) return false;
      pollfd p{fd, events, 0};
      int ready = poll(&p, 1, static_cast<int>(left.count()));
      if (ready < 0 && errno == EINTR) continue;
      return ready > 0;
    }
  };
  auto deadline = Clock::now() + options_.request_deadline;
  std::string received;
  char buffer[4096];
  Reply reply;
  bool whole = false;
  while (!whole) {
    if (!wait(POLLIN, deadline)) return;  // too slow, or stopping: closed without an answer
    ssize_t n = read(fd, buffer, sizeof buffer);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n <= 0) return;
    received.append(buffer, static_cast<std::size_t>(n));
    reply = Respond(received, peer, &whole);
  }
  uint64_t sent_bytes = 0;
  auto progress = [&] { return Clock::now() + options_.request_deadline; };
  std::string front = reply.head + reply.body;
  bool ok = true;
  deadline = progress();
  for (std::size_t sent = 0; ok && sent < front.size();) {
    ssize_t n = send(fd, front.data() + sent, front.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      ok = wait(POLLOUT, deadline);
      continue;
    }
    if (n <= 0) ok = false;
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      deadline = progress();
    }
  }
  sent_bytes += reply.body.size();
  if (ok && reply.file) {
    auto offset = static_cast<off_t>(reply.offset);
    uint64_t left = reply.length;
    while (ok && left > 0) {
      ssize_t n = sendfile(fd, reply.file.get(), &offset, std::min<uint64_t>(left, 1 << 20));
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        ok = wait(POLLOUT, deadline);
        continue;
      }
      if (n <= 0) {
        ok = false;
        break;
      }
      left -= static_cast<uint64_t>(n);
      sent_bytes += static_cast<uint64_t>(n);
      deadline = progress();
    }
  }
  bytes_.Add(static_cast<double>(sent_bytes));
  if (requests_ != nullptr) requests_->Add({reply.what, ok ? std::to_string(reply.status) : "cut"});
  log_->Info("boot.served", {{"peer", peer},
                             {"what", reply.what},
                             {"mac", reply.mac},
                             {"entry", reply.entry},
                             {"status", std::to_string(reply.status)},
                             {"bytes", std::to_string(sent_bytes)},
                             {"complete", ok ? "true" : "false"}});
}

std::string BootServer::AnswerBytes(std::string_view bytes, const std::string& peer) {
  bool whole = false;
  Reply reply = Respond(bytes, peer, &whole);
  if (!whole) return "";
  return reply.head + reply.body;
}

BootServer::Reply BootServer::Respond(std::string_view bytes, const std::string& peer,
                                      bool* whole) {
  *whole = true;
  http::request_parser<http::string_body> parser;
  parser.header_limit(kMaxHeaderBytes);
  parser.body_limit(kMaxBodyBytes);
  parser.eager(true);
  beast::error_code ec;
  std::size_t used = 0;
  while (used < bytes.size() && !parser.is_done()) {
    std::size_t n = parser.put(net::buffer(bytes.data() + used, bytes.size() - used), ec);
    used += n;
    if (ec == http::error::need_more) {
      if (bytes.size() > kMaxHeaderBytes + kMaxBodyBytes + 64) {
        ec = http::error::header_limit;  // never whole
      } else {
        *whole = false;
        return {};
      }
    }
    if (ec == http::error::header_limit) {
      return Text(http::status::request_header_fields_too_large,
                  fmt::format("request headers are limited to {} bytes\n", kMaxHeaderBytes));
    }
    if (ec == http::error::body_limit) {
      return Text(http::status::payload_too_large,
                  fmt::format("a request body is limited to {} bytes\n", kMaxBodyBytes));
    }
    if (ec) return Text(http::status::bad_request, "a malformed request\n");
    if (n == 0) break;
  }
  if (!parser.is_done()) {
    *whole = false;
    return {};
  }
  const auto& request = parser.get();
  std::string_view target(request.target().data(), request.target().size());
  std::string_view path = target.substr(0, target.find('?'));
  std::string_view query =
      target.find('?') == std::string_view::npos ? "" : target.substr(target.find('?') + 1);
  bool head = request.method() == http::verb::head;
  if (path == "/discovery") {
    if (request.method() != http::verb::post)
      return Text(http::status::method_not_allowed, "POST a token to /discovery\n");
    return Discovery(request.body(), peer);
  }
  if (request.method() != http::verb::get && !head)
    return Text(http::status::method_not_allowed, "GET or HEAD\n");
  if (path == "/boot.ipxe") {
    Reply reply = Text(
        http::status::ok,
        fmt::format("#!ipxe\nchain {}/boot/${{net0/mac:hexhyp}}.ipxe || exit 1\n", options_.url),
        head);
    reply.what = "script";
    return reply;
  }
  if (path.starts_with("/boot/")) {
    std::string_view rest = path.substr(6);
    std::optional<std::string> mac = NormalMac(rest.substr(0, 17));
    if (mac && rest.substr(17) == ".ipxe") {
      int tries = 0;
      if (query.starts_with("try=")) {
        std::string_view n = query.substr(4);
        std::from_chars(n.data(), n.data() + n.size(), tries);
      }
      return Script(*mac, std::clamp(tries, 0, kMaxTries), head);
    }
    if (mac && (rest.substr(17) == "/kernel" || rest.substr(17) == "/initrd")) {
      auto range = request.find(http::field::range);
      std::string_view range_text;
      if (range != request.end()) range_text = {range->value().data(), range->value().size()};
      return File(*mac, rest.substr(18), range_text, head);
    }
  }
  return Text(http::status::not_found,
              "no such path: /boot.ipxe, /boot/<MAC>.ipxe, /boot/<MAC>/kernel, "
              "/boot/<MAC>/initrd or POST /discovery\n",
              head);
}

BootServer::Reply BootServer::Script(const std::string& mac, int tries, bool head) {
  std::optional<BootEntry> entry = options_.entries->Find(mac);
  std::string script = "#!ipxe\n";
  std::string hyphens = mac;
  std::replace(hyphens.begin(), hyphens.end(), ':', '-');
  if (!entry) {
    if (tries >= kMaxTries) {
      script +=
          fmt::format("echo bcd: no boot entry for {}: booting the next device\nexit 1\n", mac);
    } else {
      script += fmt::format(
          "echo bcd: no boot entry for {} yet: asking again in {} s\nsleep {}\n"
          "chain --replace {}/boot/{}.ipxe?try={} || exit 1\n",
          mac, kRetrySeconds, kRetrySeconds, options_.url, hyphens, tries + 1);
    }
  } else if (entry->token_used) {
    script += fmt::format(
        "echo bcd: boot entry {} for {} was used already: booting the next device\nexit 1\n",
        entry->id, mac);
  } else {
    std::string cmdline = entry->cmdline;
    if (!cmdline.empty()) cmdline += ' ';
    cmdline += fmt::format("initrd=initrd bcd.boot={}", options_.url);
    if (!options_.gateway.empty()) cmdline += " bcd.gateway=" + options_.gateway;
    cmdline += fmt::format(" bcd.mac={} bcd.entry={} bcd.token={}", mac, entry->id, entry->token);
    script += fmt::format(
        "echo bcd: booting {} for boot entry {}\n"
        "kernel {}/boot/{}/kernel {}\n"
        "initrd {}/boot/{}/initrd\n"
        "boot\n",
        mac, entry->id, options_.url, hyphens, cmdline, options_.url, hyphens);
  }
  Reply reply = Text(http::status::ok, script, head, "text/plain; charset=utf-8");
  reply.what = "script";
  reply.mac = mac;
  if (entry) reply.entry = entry->id;
  return reply;
}

Fd BootServer::OpenVerified(const std::string& sha256) {
  std::filesystem::path path = options_.cache_dir / pki::Hex(sha256);
  Fd file(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st {};
  if (!file || fstat(file.get(), &st) != 0) {
    log_->Warn("boot.cache_missing", {{"file", path.string()}, {"error", std::strerror(errno)}});
    return Fd();
  }
  Checked now{.inode = st.st_ino,
              .size = static_cast<uint64_t>(st.st_size),
              .mtime_ns = st.st_mtim.tv_sec * 1'000'000'000 + st.st_mtim.tv_nsec};
  {
    MutexLock lock(mu_);
    auto it = checked_.find(sha256);
    if (it != checked_.end() && it->second.inode == now.inode && it->second.size == now.size &&
        it->second.mtime_ns == now.mtime_ns) {
      return file;
    }
  }
  std::optional<std::string> got = Sha256OfFile(file.get());
  if (!got) {
    log_->Warn("boot.cache_missing", {{"file", path.string()}, {"error", std::strerror(errno)}});
    return Fd();
  }
  if (*got != sha256) {
    log_->Error("boot.cache_mismatch",
                {{"file", path.string()}, {"want", pki::Hex(sha256)}, {"got", pki::Hex(*got)}});
    return Fd();
  }
  MutexLock lock(mu_);
  checked_[sha256] = now;
  return file;
}

BootServer::Reply BootServer::File(const std::string& mac, std::string_view which,
                                   std::string_view range, bool head) {
  std::optional<BootEntry> entry = options_.entries->Find(mac);
  auto tag = [&](Reply reply) {
    reply.what = std::string(which);
    reply.mac = mac;
    if (entry) reply.entry = entry->id;
    return reply;
  };
  if (!entry) {
    return tag(Text(http::status::not_found, fmt::format("no boot entry for {}\n", mac), head));
  }
  bool kernel = which == "kernel";
  const std::string& sha256 = kernel ? entry->kernel_sha256 : entry->initrd_sha256;
  const std::string& url = kernel ? entry->kernel_url : entry->initrd_url;
  if (sha256.empty()) {
    Reply reply;
    reply.status = 302;
    reply.head = Head(http::status::found, "", 0, {{"Location", url}});
    return tag(std::move(reply));
  }
  Fd file = OpenVerified(sha256);
  if (!file) {
    return tag(Text(http::status::internal_server_error,
                    fmt::format("the cached {} of boot entry {} is missing or does not match its "
                                "sha256: not served\n",
                                which, entry->id),
                    head));
  }
  struct stat st {};
  fstat(file.get(), &st);
  auto size = static_cast<uint64_t>(st.st_size);
  std::string etag = "\"" + pki::Hex(sha256) + "\"";
  Reply reply;
  std::optional<std::pair<uint64_t, uint64_t>> part = RangeOf(range, size);
  if (part && part->second == 0) {
    reply.status = 416;
    reply.head = Head(http::status::range_not_satisfiable, "", 0,
                      {{"Content-Range", fmt::format("bytes */{}", size)}});
    return tag(std::move(reply));
  }
  std::vector<std::pair<std::string, std::string>> extra = {{"Accept-Ranges", "bytes"},
                                                            {"ETag", etag}};
  if (part) {
    reply.status = 206;
    extra.emplace_back("Content-Range", fmt::format("bytes {}-{}/{}", part->first,
                                                    part->first + part->second - 1, size));
    reply.offset = part->first;
    reply.length = part->second;
    reply.head =
        Head(http::status::partial_content, "application/octet-stream", reply.length, extra);
  } else {
    reply.status = 200;
    reply.length = size;
    reply.head = Head(http::status::ok, "application/octet-stream", size, extra);
  }
  if (!head) reply.file = std::move(file);
  return tag(std::move(reply));
}

BootServer::Reply BootServer::Discovery(std::string_view body, const std::string& peer) {
  Reply reply;
  reply.what = "discovery";
  nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  auto field = [&](const char* name) -> std::optional<std::string> {
    if (!j.is_object() || !j.contains(name) || !j[name].is_string()) return std::nullopt;
    return j[name].get<std::string>();
  };
  std::optional<std::string> token = field("token"), mac_text = field("mac"),
                             nonce_hex = field("nonce");
  auto bad = [&](std::string why) {
    Reply r = Text(http::status::bad_request, why + "\n");
    r.what = "discovery";
    return r;
  };
  if (!token || !mac_text || !nonce_hex)
    return bad(R"(expected a JSON object {"token", "mac", "nonce"} of strings)");
  std::optional<std::string> mac = NormalMac(*mac_text);
  if (!mac) return bad("mac: not a MAC address");
  std::string nonce;
  if (nonce_hex->size() < 16 || nonce_hex->size() > 128 || nonce_hex->size() % 2 != 0)
    return bad("nonce: expected 8 to 64 bytes in hex");
  for (std::size_t i = 0; i < nonce_hex->size(); i += 2) {
    unsigned value = 0;
    auto [end, error] =
        std::from_chars(nonce_hex->data() + i, nonce_hex->data() + i + 2, value, 16);
    if (error != std::errc() || end != nonce_hex->data() + i + 2)
      return bad("nonce: expected 8 to 64 bytes in hex");
    nonce.push_back(static_cast<char>(value));
  }
  reply.mac = *mac;
  TokenRefusal refusal{};
  absl::StatusOr<BootEntry> entry = options_.entries->TakeToken(*mac, *token, &refusal);
  if (!entry.ok()) {
    if (!absl::IsPermissionDenied(entry.status())) {
      Reply r = Text(http::status::internal_server_error,
                     fmt::format("{}\n", ToStd(entry.status().message())));
      r.what = "discovery";
      return r;
    }
    std::optional<BootEntry> known = options_.entries->Find(*mac);
    std::string entry_id = known ? known->id : "";
    std::string reason(TokenRefusalName(refusal));
    log_->Warn("boot.discovery_refused",
               {{"peer", peer}, {"mac", *mac}, {"entry", entry_id}, {"reason", reason}});
    if (options_.refused) options_.refused(*mac, entry_id, reason, peer);
    Reply r = Text(http::status::forbidden, reason + "\n");
    r.what = "discovery";
    r.mac = *mac;
    r.entry = entry_id;
    return r;
  }
  bettercompute::agent::v1::DiscoveryAssertion assertion;
  int64_t now = options_.now();
  assertion.set_site(options_.site);
  assertion.set_mac(*mac);
  assertion.set_workflow_id(entry->workflow_id);
  assertion.set_boot_entry_id(entry->id);
  assertion.set_nonce(nonce);
  assertion.set_iat(static_cast<uint64_t>(now));
  assertion.set_exp(static_cast<uint64_t>(now + kAssertionSeconds));
  bettercompute::agent::v1::SignedDiscoveryAssertion signed_assertion;
  signed_assertion.set_body(assertion.SerializeAsString());
  absl::StatusOr<bettercompute::common::v1::Signature> signature =
      options_.sign(proto::BodySigningInput(proto::Purpose::kDiscovery, signed_assertion.body()));
  reply.entry = entry->id;
  if (!signature.ok()) {
    log_->Error("boot.discovery_failed",
                {{"mac", *mac},
                 {"entry", entry->id},
                 {"error", std::string(ToStd(signature.status().message()))}});
    Reply r = Text(http::status::internal_server_error, "the assertion could not be signed\n");
    r.what = "discovery";
    return r;
  }
  *signed_assertion.mutable_signature() = *signature;
  log_->Info(
      "boot.discovered",
      {{"peer", peer}, {"mac", *mac}, {"entry", entry->id}, {"workflow_id", entry->workflow_id}});
  Reply ok =
      Text(http::status::ok, pki::Base64UrlEncode(signed_assertion.SerializeAsString()) + "\n");
  ok.what = "discovery";
  ok.mac = *mac;
  ok.entry = entry->id;
  return ok;
}

}  // namespace bcd
