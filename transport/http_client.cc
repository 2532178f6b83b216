#include "transport/http_client.h"

// Boost 1.74 with g++ 12 in C++20 needs <utility> before the Asio headers.
#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <functional>
#include <limits>
#include <memory>
#include <utility>

#include "base/fd.h"
#include "base/files.h"
#include "base/version.h"
#include "config/config.h"
#include "fmt/format.h"
#include "pki/keys.h"
#include "proto/absl_compat.h"

namespace bcd {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;

bool SafeHeader(std::string_view name, std::string_view value) {
  if (name.empty()) return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') return false;
  }
  for (char c : value) {
    if (c == '\r' || c == '\n' || c == '\0') return false;
  }
  std::string lower;
  for (char c : name) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // Framing is ours to set.
  return lower != "host" && lower != "content-length" && lower != "transfer-encoding" &&
         lower != "connection";
}

// Runs `ioc` until its work is done. When `stop` turns true, `cancel` is called once: the pending
// operations then finish with operation_aborted.
void RunWatching(net::io_context& ioc, const std::atomic<bool>* stop,
                 const std::function<void()>& cancel) {
  ioc.restart();
  bool cancelled = false;
  while (!ioc.stopped()) {
    ioc.run_for(std::chrono::milliseconds(100));
    if (!cancelled && stop != nullptr && stop->load()) {
      cancel();
      cancelled = true;
    }
  }
}

absl::Status Failed(const UploadRequest& request, const std::string& host, std::string_view what,
                    const beast::error_code& ec) {
  if (request.stop != nullptr && request.stop->load())
    return absl::CancelledError(fmt::format("upload to {}: stopped", host));
  return absl::UnavailableError(fmt::format("upload to {}: {}{}", host, what, ec.message()));
}

// Sends `put` on a connected `stream` and reads the answer, within the stream's expiry.
template <class Stream>
absl::Status Exchange(Stream& stream, net::io_context& ioc, http::request<http::file_body>& put,
                      const UploadRequest& request, const std::string& host) {
  beast::error_code failed;
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(64 * 1024);
  http::async_write(stream, put, [&](beast::error_code ec, std::size_t) {
    if (ec) {
      failed = ec;
      return;
    }
    http::async_read(stream, buffer, parser, [&](beast::error_code ec, std::size_t) {
      if (ec) failed = ec;
    });
  });
  RunWatching(ioc, request.stop, [&] { beast::get_lowest_layer(stream).cancel(); });
  if (failed) return Failed(request, host, "", failed);
  const auto& response = parser.get();
  unsigned status = response.result_int();
  if (status < 200 || status > 299) {
    std::string body = response.body().substr(0, 200);
    return absl::FailedPreconditionError(
        fmt::format("upload to {}: the server answered {} {}", host, status, body));
  }
  return absl::OkStatus();
}

}  // namespace

bool SafeRequestHeader(std::string_view name, std::string_view value) {
  return SafeHeader(name, value);
}

absl::Status CheckUploadRequest(const UploadRequest& request) {
  absl::StatusOr<Url> url = Url::Parse(request.url, {"https", "http"}, /*allow_query=*/true);
  if (!url.ok())
    return absl::InvalidArgumentError(fmt::format("upload_url: {}", ToStd(url.status().message())));
  for (const auto& [name, value] : request.headers) {
    if (!SafeHeader(name, value)) {
      return absl::InvalidArgumentError(fmt::format("upload header \"{}\" is not allowed", name));
    }
  }
  return absl::OkStatus();
}

absl::Status HttpPutFile(const UploadRequest& request) {
  if (absl::Status s = CheckUploadRequest(request); !s.ok()) return s;
  Url url = *Url::Parse(request.url, {"https", "http"}, /*allow_query=*/true);
  bool tls = url.scheme() == "https";
  http::request<http::file_body> put{http::verb::put, url.target(), 11};
  beast::error_code ec;
  put.body().open(request.file.c_str(), beast::file_mode::scan, ec);
  if (ec) {
    return absl::InternalError(fmt::format("{}: {}", request.file.string(), ec.message()));
  }
  std::string host_header =
      (url.host().find(':') != std::string::npos ? "[" + url.host() + "]" : url.host());
  if (url.port() != (tls ? 443 : 80)) host_header += ":" + std::to_string(url.port());
  put.set(http::field::host, host_header);
  put.set(http::field::user_agent, "bcd/" + std::string(Version()));
  for (const auto& [name, value] : request.headers) put.set(name, value);
  put.prepare_payload();  // Content-Length from the file's size

  net::io_context ioc;
  std::vector<tcp::endpoint> endpoints;
  beast::error_code failed;
  if (request.resolve) {
    for (const std::string& text : request.resolve(url.host())) {
      net::ip::address address = net::ip::make_address(text, failed);
      if (failed) return Failed(request, url.host(), "", failed);
      endpoints.emplace_back(address, url.port());
    }
    if (endpoints.empty())
      return absl::UnavailableError(fmt::format("upload to {}: no address", url.host()));
  } else {
    tcp::resolver resolver(ioc);
    resolver.async_resolve(url.host(), std::to_string(url.port()),
                           [&](beast::error_code e, tcp::resolver::results_type found) {
                             failed = e;
                             for (const auto& entry : found) endpoints.push_back(entry.endpoint());
                           });
    RunWatching(ioc, request.stop, [&] { resolver.cancel(); });
    if (failed) return Failed(request, url.host(), "", failed);
  }
  if (!tls) {
    // The decision is made on the addresses connected to, never on how the host is spelled.
    for (const tcp::endpoint& endpoint : endpoints) {
      if (!endpoint.address().is_loopback()) {
        return absl::InvalidArgumentError(fmt::format(
            "upload_url: plain http is allowed only to loopback addresses, and {} resolves to {}",
            url.host(), endpoint.address().to_string()));
      }
    }
  }
  auto connect = [&](beast::tcp_stream& stream) -> absl::Status {
    stream.expires_after(request.timeout);
    stream.async_connect(endpoints, [&](beast::error_code e, const tcp::endpoint&) { failed = e; });
    RunWatching(ioc, request.stop, [&] { stream.cancel(); });
    if (failed) return Failed(request, url.host(), "", failed);
    return absl::OkStatus();
  };
  if (!tls) {
    beast::tcp_stream stream(ioc);
    if (absl::Status s = connect(stream); !s.ok()) return s;
    return Exchange(stream, ioc, put, request, url.host());
  }
  ssl::context context(ssl::context::tls_client);
  SSL_CTX_set_min_proto_version(context.native_handle(), TLS1_3_VERSION);
  context.set_default_verify_paths();
  context.set_verify_mode(ssl::verify_peer);
  beast::ssl_stream<beast::tcp_stream> stream(ioc, context);
  SSL_set_tlsext_host_name(stream.native_handle(), url.host().c_str());
  SSL_set1_host(stream.native_handle(), url.host().c_str());
  if (absl::Status s = connect(beast::get_lowest_layer(stream)); !s.ok()) return s;
  stream.async_handshake(ssl::stream_base::client, [&](beast::error_code e) { failed = e; });
  RunWatching(ioc, request.stop, [&] { beast::get_lowest_layer(stream).cancel(); });
  if (failed) return Failed(request, url.host(), "TLS: ", failed);
  return Exchange(stream, ioc, put, request, url.host());
}

namespace {

using Deadline = std::chrono::steady_clock::time_point;

std::chrono::milliseconds Left(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

// One download's connection: where it goes, the file it fills and the hash of what went in.
struct Fetch {
  const DownloadRequest& request;
  Deadline deadline;
  net::io_context ioc;
  Fd file;
  Downloaded got;
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> sha{EVP_MD_CTX_new(), EVP_MD_CTX_free};

  absl::Status Failed(const std::string& where, std::string_view what,
                      const beast::error_code& ec) const {
    if (request.stop != nullptr && request.stop->load())
      return absl::CancelledError(fmt::format("download from {}: stopped", where));
    if (ec == beast::error::timeout)
      return absl::UnavailableError(fmt::format("download from {}: timed out", where));
    return absl::UnavailableError(fmt::format("download from {}: {}{}", where, what, ec.message()));
  }

  // Runs the async operation `start` begins until it completes, cancelling it on `stop`.
  template <class Start, class Cancel>
  beast::error_code Await(Start start, Cancel cancel) {
    beast::error_code result;
    bool done = false;
    start([&](beast::error_code ec) {
      result = ec;
      done = true;
    });
    RunWatching(ioc, request.stop, cancel);
    if (!done) return net::error::operation_aborted;
    return result;
  }
};

absl::StatusOr<std::vector<tcp::endpoint>> Resolve(Fetch& f, const std::string& host,
                                                   uint16_t port) {
  std::vector<tcp::endpoint> endpoints;
  beast::error_code ec;
  if (f.request.resolve) {
    for (const std::string& text : f.request.resolve(host)) {
      net::ip::address address = net::ip::make_address(text, ec);
      if (ec) return f.Failed(host, "", ec);
      endpoints.emplace_back(address, port);
    }
  } else {
    tcp::resolver resolver(f.ioc);
    ec = f.Await(
        [&](auto done) {
          resolver.async_resolve(host, std::to_string(port),
                                 [&, done](beast::error_code e, tcp::resolver::results_type found) {
                                   for (const auto& entry : found)
                                     endpoints.push_back(entry.endpoint());
                                   done(e);
                                 });
        },
        [&] { resolver.cancel(); });
    if (ec) return f.Failed(host, "", ec);
  }
  if (endpoints.empty())
    return absl::UnavailableError(fmt::format("download from {}: no address", host));
  return endpoints;
}

// Asks the proxy on `stream` for a tunnel to host:port.
absl::Status ProxyConnect(Fetch& f, beast::tcp_stream& stream, const transport::ProxySpec& proxy,
                          const Url& url) {
  std::string authority =
      (url.host().find(':') != std::string::npos ? "[" + url.host() + "]" : url.host()) + ":" +
      std::to_string(url.port());
  http::request<http::empty_body> connect{http::verb::connect, authority, 11};
  connect.set(http::field::host, authority);
  connect.set(http::field::user_agent, "bcd/" + std::string(Version()));
  if (!proxy.authorization.empty())
    connect.set(http::field::proxy_authorization, proxy.authorization);
  beast::flat_buffer buffer;
  http::response_parser<http::empty_body> parser;
  parser.skip(true);  // a CONNECT answer has no body, whatever its headers say
  std::string where = "the proxy " + proxy.display;
  stream.expires_after(Left(f.deadline));
  beast::error_code ec = f.Await(
      [&](auto done) {
        http::async_write(stream, connect, [&, done](beast::error_code e, std::size_t) {
          if (e) return done(e);
          http::async_read(stream, buffer, parser,
                           [done](beast::error_code e2, std::size_t) { done(e2); });
        });
      },
      [&] { stream.cancel(); });
  if (ec) return f.Failed(where, "", ec);
  if (parser.get().result_int() != 200) {
    return absl::UnavailableError(
        fmt::format("download: {} answered CONNECT with {}", where, parser.get().result_int()));
  }
  if (buffer.size() != 0)
    return absl::UnavailableError(fmt::format("download: {} sent bytes before TLS", where));
  return absl::OkStatus();
}

// What one GET answered: a redirect's location, or the body in the file.
struct Answer {
  std::optional<std::string> location;
};

// The GET itself on a connected `stream` (TLS, or plain TCP for allow_http): the request, the
// answer's headers, the body into the file.
template <class Stream>
absl::StatusOr<Answer> GetOn(Fetch& f, Stream& stream, const Url& url) {
  const DownloadRequest& request = f.request;
  beast::tcp_stream& tcp = beast::get_lowest_layer(stream);
  uint16_t default_port = url.scheme() == "https" ? 443 : 80;
  http::request<http::empty_body> get{http::verb::get, url.target(), 11};
  std::string host_header =
      (url.host().find(':') != std::string::npos ? "[" + url.host() + "]" : url.host());
  if (url.port() != default_port) host_header += ":" + std::to_string(url.port());
  get.set(http::field::host, host_header);
  get.set(http::field::user_agent, "bcd/" + std::string(Version()));
  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(request.max_bytes);
  beast::error_code ec = f.Await(
      [&](auto done) {
        http::async_write(stream, get, [&, done](beast::error_code e, std::size_t) {
          if (e) return done(e);
          http::async_read_header(stream, buffer, parser,
                                  [done](beast::error_code e2, std::size_t) { done(e2); });
        });
      },
      [&] { tcp.cancel(); });
  if (ec == http::error::body_limit) {  // its Content-Length says more than the cap
    return absl::ResourceExhaustedError(
        fmt::format("download from {}: {} bytes is over the cap of {}", url.host(),
                    parser.content_length().value_or(0), request.max_bytes));
  }
  if (ec) return f.Failed(url.host(), "", ec);
  unsigned status = parser.get().result_int();
  if (status == 301 || status == 302 || status == 303 || status == 307 || status == 308) {
    auto location = parser.get().find(http::field::location);
    if (location == parser.get().end())
      return absl::FailedPreconditionError(
          fmt::format("download from {}: {} without a Location", url.host(), status));
    return Answer{std::string(location->value())};
  }
  if (status != 200) {
    return absl::FailedPreconditionError(
        fmt::format("download from {}: the server answered {}", url.host(), status));
  }
  std::optional<uint64_t> length;
  if (parser.content_length()) length = *parser.content_length();
  if (length && *length > request.max_bytes) {
    return absl::ResourceExhaustedError(
        fmt::format("download from {}: {} bytes is over the cap of {}", url.host(), *length,
                    request.max_bytes));
  }
  if (request.on_length) {
    if (absl::Status s = request.on_length(length); !s.ok()) return s;
  }
  std::vector<char> chunk(64 * 1024);
  while (!parser.is_done()) {
    parser.get().body().data = chunk.data();
    parser.get().body().size = chunk.size();
    ec = f.Await(
        [&](auto done) {
          http::async_read(stream, buffer, parser,
                           [done](beast::error_code e, std::size_t) { done(e); });
        },
        [&] { tcp.cancel(); });
    if (ec == http::error::body_limit) {
      return absl::ResourceExhaustedError(fmt::format(
          "download from {}: more than the cap of {} bytes", url.host(), request.max_bytes));
    }
    if (ec && ec != http::error::need_buffer) return f.Failed(url.host(), "", ec);
    std::size_t n = chunk.size() - parser.get().body().size;
    for (std::size_t written = 0; written < n;) {
      ssize_t w = write(f.file.get(), chunk.data() + written, n - written);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return ErrnoStatus("download: cannot write", request.file);
      written += static_cast<std::size_t>(w);
    }
    EVP_DigestUpdate(f.sha.get(), chunk.data(), n);
    f.got.bytes += n;
  }
  return Answer{};
}

absl::StatusOr<Answer> Get(Fetch& f, const Url& url) {
  const DownloadRequest& request = f.request;
  bool tls = url.scheme() == "https";
  // Plain http (allow_http: content the caller verifies by hash, on the site's network) goes
  // straight to the host: a proxy of the environment is for the way out, not for the site.
  absl::StatusOr<std::optional<transport::ProxySpec>> proxy =
      tls ? transport::ProxyFor(url.host(), url.port(), request.env)
          : absl::StatusOr<std::optional<transport::ProxySpec>>(std::nullopt);
  if (!proxy.ok())
    return absl::UnavailableError(fmt::format("download: {}", ToStd(proxy.status().message())));
  std::string connect_host = *proxy ? (*proxy)->host : url.host();
  uint16_t connect_port = *proxy ? (*proxy)->port : url.port();
  absl::StatusOr<std::vector<tcp::endpoint>> endpoints = Resolve(f, connect_host, connect_port);
  if (!endpoints.ok()) return endpoints.status();
  auto connect = [&](beast::tcp_stream& tcp) -> absl::Status {
    tcp.expires_after(Left(f.deadline));
    beast::error_code ec = f.Await(
        [&](auto done) {
          tcp.async_connect(*endpoints,
                            [done](beast::error_code e, const tcp::endpoint&) { done(e); });
        },
        [&] { tcp.cancel(); });
    if (ec) return f.Failed(*proxy ? "the proxy " + (*proxy)->display : url.host(), "", ec);
    return absl::OkStatus();
  };
  if (!tls) {
    beast::tcp_stream plain(f.ioc);
    if (absl::Status s = connect(plain); !s.ok()) return s;
    return GetOn(f, plain, url);
  }

  ssl::context context(ssl::context::tls_client);
  SSL_CTX_set_min_proto_version(context.native_handle(), TLS1_3_VERSION);
  context.set_default_verify_paths();
  context.set_verify_mode(ssl::verify_peer);
  beast::ssl_stream<beast::tcp_stream> stream(f.ioc, context);
  beast::tcp_stream& tcp = beast::get_lowest_layer(stream);
  if (absl::Status s = connect(tcp); !s.ok()) return s;
  if (*proxy) {
    if (absl::Status s = ProxyConnect(f, tcp, **proxy, url); !s.ok()) return s;
  }
  SSL_set_tlsext_host_name(stream.native_handle(), url.host().c_str());
  SSL_set1_host(stream.native_handle(), url.host().c_str());
  tcp.expires_after(Left(f.deadline));
  beast::error_code ec =
      f.Await([&](auto done) { stream.async_handshake(ssl::stream_base::client, done); },
              [&] { tcp.cancel(); });
  if (ec) return f.Failed(url.host(), "TLS: ", ec);
  return GetOn(f, stream, url);
}

}  // namespace

absl::StatusOr<Downloaded> HttpGetToFile(const DownloadRequest& request) {
  Fetch f{.request = request, .deadline = std::chrono::steady_clock::now() + request.timeout};
  auto fail = [&](absl::Status status) {
    f.file.reset();
    unlink(request.file.c_str());
    return status;
  };
  std::string next = request.url;
  for (int hop = 0;; ++hop) {
    absl::StatusOr<Url> url = request.allow_http
                                  ? Url::Parse(next, {"https", "http"}, /*allow_query=*/true)
                                  : Url::Parse(next, {"https"}, /*allow_query=*/true);
    if (!url.ok()) {
      return fail(absl::InvalidArgumentError(fmt::format(
          "{}{}", hop == 0 ? "url: " : "a redirect to \"" + next.substr(0, 200) + "\": ",
          ToStd(url.status().message()))));
    }
    f.file.reset(open(request.file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!f.file) return fail(ErrnoStatus("download: cannot create", request.file));
    EVP_DigestInit_ex(f.sha.get(), EVP_sha256(), nullptr);
    f.got = {};
    absl::StatusOr<Answer> answer = Get(f, *url);
    if (!answer.ok()) return fail(answer.status());
    if (!answer->location) break;
    if (hop == 5) return fail(absl::FailedPreconditionError("download: more than 5 redirects"));
    next = *answer->location;
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_DigestFinal_ex(f.sha.get(), digest, &size);
  f.got.sha256.assign(reinterpret_cast<char*>(digest), size);
  if (SyncFile(f.file.get()) != 0 || !f.file.Close())
    return fail(ErrnoStatus("download: cannot sync", request.file));
  return f.got;
}

namespace {

// The sha256 of the public key of the peer's leaf certificate; empty when there is none.
std::string PeerSpkiSha256(SSL* ssl) {
  X509* leaf = SSL_get0_peer_certificate(ssl);
  if (leaf == nullptr) return {};
  unsigned char* der = nullptr;
  int n = i2d_X509_PUBKEY(X509_get_X509_PUBKEY(leaf), &der);
  if (n <= 0) return {};
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(der, static_cast<std::size_t>(n), digest, &size, EVP_sha256(), nullptr);
  OPENSSL_free(der);
  return std::string(reinterpret_cast<char*>(digest), size);
}

}  // namespace

// One TLS connection to a device, kept while the device keeps it (HTTP/1.1 keep-alive).
struct DeviceConnection::Impl {
  net::io_context ioc;
  std::unique_ptr<ssl::context> context;
  std::unique_ptr<beast::ssl_stream<beast::tcp_stream>> stream;
  beast::flat_buffer buffer;
  std::string host;  // what the open connection reaches
  uint16_t port = 0;

  // Runs the async operation `start` begins until it completes, cancelling it on `stop`.
  template <class Start>
  beast::error_code Await(const DeviceRequest& request, Start start) {
    beast::error_code result;
    bool done = false;
    start([&](beast::error_code ec) {
      result = ec;
      done = true;
    });
    RunWatching(ioc, request.stop, [&] { beast::get_lowest_layer(*stream).cancel(); });
    if (!done) return net::error::operation_aborted;
    return result;
  }

  absl::Status Lost(const DeviceRequest& request, std::string_view what,
                    const beast::error_code& ec) const {
    if (request.stop != nullptr && request.stop->load())
      return absl::CancelledError(fmt::format("{}: stopped", request.host));
    if (ec == beast::error::timeout || ec == net::error::operation_aborted)
      return absl::UnavailableError(fmt::format("{}: {}timed out", request.host, what));
    return absl::UnavailableError(fmt::format("{}: {}{}", request.host, what, ec.message()));
  }

  void Close() {
    stream.reset();
    context.reset();
    buffer.clear();
  }

  // Resolves, connects, shakes hands and checks the certificate the way `request.trust` says.
  absl::Status Connect(const DeviceRequest& request, std::chrono::steady_clock::time_point end) {
    Close();
    const std::string& host = request.host;
    std::vector<tcp::endpoint> endpoints;
    beast::error_code ec;
    net::ip::address literal = net::ip::make_address(host, ec);
    bool is_ip = !ec;
    if (is_ip) {
      endpoints.emplace_back(literal, request.port);
    } else {
      tcp::resolver resolver(ioc);
      bool done = false;
      resolver.async_resolve(host, std::to_string(request.port),
                             [&](beast::error_code e, tcp::resolver::results_type found) {
                               for (const auto& entry : found)
                                 endpoints.push_back(entry.endpoint());
                               ec = e;
                               done = true;
                             });
      RunWatching(ioc, request.stop, [&] { resolver.cancel(); });
      if (!done) ec = net::error::operation_aborted;
      if (ec) return Lost(request, "cannot resolve: ", ec);
      if (endpoints.empty()) return absl::UnavailableError(fmt::format("{}: no address", host));
    }
    context = std::make_unique<ssl::context>(ssl::context::tls_client);
    SSL_CTX_set_min_proto_version(context->native_handle(), TLS1_3_VERSION);
    const DeviceTrust& trust = request.trust;
    if (!trust.ca_file.empty()) {
      context->load_verify_file(trust.ca_file, ec);
      if (ec) {
        return absl::FailedPreconditionError(
            fmt::format("{}: cannot read the CA file {}: {}", host, trust.ca_file, ec.message()));
      }
      context->set_verify_mode(ssl::verify_peer);
    } else if (trust.spki_sha256.size() == 32 || trust.unverified) {
      context->set_verify_mode(ssl::verify_none);  // the pin is checked after the handshake
    } else {
      return absl::FailedPreconditionError(
          fmt::format("{}: no way to trust its certificate", host));
    }
    stream = std::make_unique<beast::ssl_stream<beast::tcp_stream>>(ioc, *context);
    if (!is_ip) {  // an IP literal sends no SNI
      SSL_set_tlsext_host_name(stream->native_handle(), host.c_str());
      if (!trust.ca_file.empty()) SSL_set1_host(stream->native_handle(), host.c_str());
    } else if (!trust.ca_file.empty()) {
      X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(stream->native_handle()), host.c_str());
    }
    beast::tcp_stream& tcp = beast::get_lowest_layer(*stream);
    tcp.expires_after(Left(end));
    ec = Await(request, [&](auto done) {
      tcp.async_connect(endpoints, [done](beast::error_code e, const tcp::endpoint&) { done(e); });
    });
    if (ec) return Lost(request, "", ec);
    tcp.expires_after(Left(end));
    ec =
        Await(request, [&](auto done) { stream->async_handshake(ssl::stream_base::client, done); });
    if (ec) {
      long verify = SSL_get_verify_result(stream->native_handle());
      if (!trust.ca_file.empty() && verify != X509_V_OK) {
        return absl::PermissionDeniedError(
            fmt::format("{}: TLS: its certificate does not chain to {} for this address: {}", host,
                        trust.ca_file, X509_verify_cert_error_string(verify)));
      }
      return Lost(request, "TLS: ", ec);
    }
    if (trust.ca_file.empty() && !trust.unverified) {
      std::string got = PeerSpkiSha256(stream->native_handle());
      if (got != trust.spki_sha256) {
        Close();
        return absl::PermissionDeniedError(
            fmt::format("{}: TLS: its certificate's key has sha256 {}, not the pinned {}", host,
                        pki::Hex(got), pki::Hex(trust.spki_sha256)));
      }
    }
    this->host = host;
    port = request.port;
    return absl::OkStatus();
  }

  // Sends the request on the open connection and reads the answer. `*answered_nothing` tells, on
  // an error, that the device closed the connection before a byte of an answer came.
  absl::StatusOr<DeviceAnswer> RoundTrip(const DeviceRequest& request,
                                         std::chrono::steady_clock::time_point end,
                                         bool* answered_nothing) {
    http::request<http::string_body> out{http::string_to_verb(request.method), request.target, 11};
    std::string host_header =
        request.host.find(':') != std::string::npos ? "[" + request.host + "]" : request.host;
    if (request.port != 443) host_header += ":" + std::to_string(request.port);
    out.set(http::field::host, host_header);
    out.set(http::field::user_agent, "bcd/" + std::string(Version()));
    for (const auto& [name, value] : request.headers) out.set(name, value);
    if (!request.body.empty()) out.body() = request.body;
    out.keep_alive(true);
    out.prepare_payload();
    http::response_parser<http::string_body> parser;
    parser.body_limit(request.max_body);
    beast::get_lowest_layer(*stream).expires_after(Left(end));
    beast::error_code ec = Await(request, [&](auto done) {
      http::async_write(*stream, out, [&, done](beast::error_code e, std::size_t) {
        if (e) return done(e);
        http::async_read(*stream, buffer, parser,
                         [done](beast::error_code e2, std::size_t) { done(e2); });
      });
    });
    *answered_nothing = ec && !parser.got_some() && ec != beast::error::timeout &&
                        !(request.stop != nullptr && request.stop->load());
    if (ec == http::error::body_limit) {
      Close();
      return absl::ResourceExhaustedError(
          fmt::format("{}: an answer larger than {} bytes", request.host, request.max_body));
    }
    if (ec) {
      Close();
      return Lost(request, "", ec);
    }
    DeviceAnswer answer;
    answer.status = parser.get().result_int();
    for (const auto& field : parser.get()) {
      std::string name(field.name_string());
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      answer.headers[name] = std::string(field.value());
    }
    if (!parser.keep_alive()) Close();
    answer.body = std::move(parser.get().body());
    return answer;
  }
};

DeviceConnection::DeviceConnection() : impl_(std::make_unique<Impl>()) {}
DeviceConnection::~DeviceConnection() = default;

absl::StatusOr<DeviceAnswer> DeviceConnection::Exchange(const DeviceRequest& request) {
  auto end = std::chrono::steady_clock::now() + request.timeout;
  bool reused = impl_->stream && impl_->host == request.host && impl_->port == request.port;
  if (!reused) {
    if (absl::Status s = impl_->Connect(request, end); !s.ok()) return s;
  }
  bool answered_nothing = false;
  absl::StatusOr<DeviceAnswer> answer = impl_->RoundTrip(request, end, &answered_nothing);
  // A kept connection the device closed while it was idle: once more on a new one.
  if (!answer.ok() && reused && answered_nothing) {
    if (absl::Status s = impl_->Connect(request, end); !s.ok()) return s;
    answer = impl_->RoundTrip(request, end, &answered_nothing);
  }
  return answer;
}

absl::StatusOr<DeviceAnswer> HttpDeviceExchange(const DeviceRequest& request) {
  DeviceConnection connection;
  return connection.Exchange(request);
}

namespace {

// The exchange of HttpSiteExchange on a connected stream (plain TCP or TLS).
template <class Stream>
absl::StatusOr<SiteHttpAnswer> SiteRoundTrip(net::io_context& ioc, Stream& stream,
                                             const SiteHttpRequest& request,
                                             std::chrono::steady_clock::time_point end) {
  auto lost = [&](const beast::error_code& ec) -> absl::Status {
    if (request.stop != nullptr && request.stop->load())
      return absl::CancelledError(fmt::format("{}: stopped", request.host));
    if (ec == beast::error::timeout || ec == net::error::operation_aborted)
      return absl::UnavailableError(fmt::format("{}: timed out", request.host));
    return absl::UnavailableError(fmt::format("{}: {}", request.host, ec.message()));
  };
  auto await = [&](auto start) {
    beast::error_code result;
    bool done = false;
    start([&](beast::error_code ec) {
      result = ec;
      done = true;
    });
    RunWatching(ioc, request.stop, [&] { beast::get_lowest_layer(stream).cancel(); });
    return done ? result : beast::error_code(net::error::operation_aborted);
  };
  http::request<http::string_body> out{http::string_to_verb(request.method), request.target, 11};
  if (out.method() == http::verb::unknown) out.method_string(request.method);
  std::string host_header =
      request.host.find(':') != std::string::npos ? "[" + request.host + "]" : request.host;
  if (request.port != (request.tls ? 443 : 80)) host_header += ":" + std::to_string(request.port);
  out.set(http::field::host, host_header);
  out.set(http::field::user_agent, "bcd/" + std::string(Version()));
  for (const auto& [name, value] : request.headers) out.insert(name, value);
  if (!request.body.empty()) out.body() = request.body;
  out.keep_alive(false);
  out.prepare_payload();
  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());  // cut by max_body below
  if (out.method() == http::verb::head) parser.skip(true);
  beast::get_lowest_layer(stream).expires_after(Left(end));
  beast::error_code ec = await([&](auto done) {
    http::async_write(stream, out, [&, done](beast::error_code e, std::size_t) {
      if (e) return done(e);
      http::async_read_header(stream, buffer, parser,
                              [done](beast::error_code e2, std::size_t) { done(e2); });
    });
  });
  if (ec) return lost(ec);
  SiteHttpAnswer answer;
  answer.status = parser.get().result_int();
  for (const auto& field : parser.get())
    answer.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  std::vector<char> chunk(64 * 1024);
  while (!parser.is_done()) {
    parser.get().body().data = chunk.data();
    parser.get().body().size = chunk.size();
    ec = await([&](auto done) {
      http::async_read(stream, buffer, parser,
                       [done](beast::error_code e, std::size_t) { done(e); });
    });
    if (ec && ec != http::error::need_buffer) return lost(ec);
    std::size_t n = chunk.size() - parser.get().body().size;
    std::size_t room = request.max_body - answer.body.size();
    answer.body.append(chunk.data(), std::min(n, room));
    if (n > room) {  // the rest is not read: the connection goes with the exchange
      answer.truncated = true;
      break;
    }
  }
  return answer;
}

}  // namespace

absl::StatusOr<SiteHttpAnswer> HttpSiteExchange(const SiteHttpRequest& request) {
  auto end = std::chrono::steady_clock::now() + request.timeout;
  net::io_context ioc;
  std::vector<tcp::endpoint> endpoints;
  for (const std::string& text : request.addresses) {
    beast::error_code ec;
    net::ip::address address = net::ip::make_address(text, ec);
    if (ec) return absl::InvalidArgumentError(fmt::format("{} is not an IP address", text));
    endpoints.emplace_back(address, request.port);
  }
  if (endpoints.empty())
    return absl::InvalidArgumentError(fmt::format("{}: no address to connect to", request.host));
  auto connect = [&](beast::tcp_stream& tcp) -> absl::Status {
    beast::error_code result;
    bool done = false;
    tcp.expires_after(Left(end));
    tcp.async_connect(endpoints, [&](beast::error_code e, const tcp::endpoint&) {
      result = e;
      done = true;
    });
    RunWatching(ioc, request.stop, [&] { tcp.cancel(); });
    if (request.stop != nullptr && request.stop->load())
      return absl::CancelledError(fmt::format("{}: stopped", request.host));
    if (!done || result == beast::error::timeout)
      return absl::UnavailableError(fmt::format("{}: connect: timed out", request.host));
    if (result)
      return absl::UnavailableError(fmt::format("{}: connect: {}", request.host, result.message()));
    return absl::OkStatus();
  };
  if (!request.tls) {
    beast::tcp_stream tcp(ioc);
    if (absl::Status s = connect(tcp); !s.ok()) return s;
    return SiteRoundTrip(ioc, tcp, request, end);
  }
  ssl::context context(ssl::context::tls_client);
  SSL_CTX_set_min_proto_version(context.native_handle(), TLS1_3_VERSION);
  context.set_default_verify_paths();
  if (!request.ca_file.empty()) {
    beast::error_code ec;
    context.load_verify_file(request.ca_file, ec);
    if (ec) {
      return absl::FailedPreconditionError(
          fmt::format("cannot read the CA file {}: {}", request.ca_file, ec.message()));
    }
  }
  context.set_verify_mode(ssl::verify_peer);
  beast::ssl_stream<beast::tcp_stream> stream(ioc, context);
  beast::error_code literal_ec;
  net::ip::make_address(request.host, literal_ec);
  if (literal_ec) {  // a name: SNI and the name checked; an IP literal: the IP checked
    SSL_set_tlsext_host_name(stream.native_handle(), request.host.c_str());
    SSL_set1_host(stream.native_handle(), request.host.c_str());
  } else {
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(stream.native_handle()), request.host.c_str());
  }
  if (absl::Status s = connect(beast::get_lowest_layer(stream)); !s.ok()) return s;
  beast::error_code ec;
  bool done = false;
  beast::get_lowest_layer(stream).expires_after(Left(end));
  stream.async_handshake(ssl::stream_base::client, [&](beast::error_code e) {
    ec = e;
    done = true;
  });
  RunWatching(ioc, request.stop, [&] { beast::get_lowest_layer(stream).cancel(); });
  if (!done) ec = net::error::operation_aborted;
  if (ec) {
    long verify = SSL_get_verify_result(stream.native_handle());
    if (verify != X509_V_OK) {
      return absl::PermissionDeniedError(fmt::format("{}: TLS: its certificate does not verify: {}",
                                                     request.host,
                                                     X509_verify_cert_error_string(verify)));
    }
    if (request.stop != nullptr && request.stop->load())
      return absl::CancelledError(fmt::format("{}: stopped", request.host));
    return absl::UnavailableError(fmt::format(
        "{}: TLS: {}", request.host, ec == beast::error::timeout ? "timed out" : ec.message()));
  }
  return SiteRoundTrip(ioc, stream, request, end);
}

}  // namespace bcd
