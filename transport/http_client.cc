#include "modes/common/http_upload.h"

// Boost 1.74 with g++ 12 in C++20 needs <utility> before the Asio headers.
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <functional>
#include <utility>

#include "config/config.h"
#include "fmt/format.h"
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
  put.set(http::field::user_agent, "bcd/" BCD_VERSION);
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

}  // namespace bcd
