#include "daemon/http_upload.h"

// Boost 1.74 with g++ 12 in C++20 needs <utility> before the Asio headers.
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <utility>

#include "daemon/config.h"
#include "fmt/format.h"
#include "proto/absl_compat.h"

namespace bcd {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.starts_with("127.");
}

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

// Sends `request` on a connected `stream` and reads the answer, within the stream's expiry.
template <class Stream>
absl::Status Exchange(Stream& stream, net::io_context& ioc, http::request<http::file_body>& request,
                      const std::string& host) {
  beast::error_code failed;
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(64 * 1024);
  http::async_write(stream, request, [&](beast::error_code ec, std::size_t) {
    if (ec) {
      failed = ec;
      return;
    }
    http::async_read(stream, buffer, parser, [&](beast::error_code ec, std::size_t) {
      if (ec) failed = ec;
    });
  });
  ioc.restart();
  ioc.run();
  if (failed) {
    return absl::UnavailableError(fmt::format("upload to {}: {}", host, failed.message()));
  }
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

absl::Status HttpPutFile(const UploadRequest& request) {
  absl::StatusOr<Url> url = Url::Parse(request.url, {"https", "http"}, /*allow_query=*/true);
  if (!url.ok())
    return absl::InvalidArgumentError(fmt::format("upload_url: {}", ToStd(url.status().message())));
  bool tls = url->scheme() == "https";
  if (!tls && !IsLoopback(url->host())) {
    return absl::InvalidArgumentError(fmt::format(
        "upload_url: plain http is allowed only to a loopback address, got host {}", url->host()));
  }
  for (const auto& [name, value] : request.headers) {
    if (!SafeHeader(name, value)) {
      return absl::InvalidArgumentError(fmt::format("upload header \"{}\" is not allowed", name));
    }
  }
  http::request<http::file_body> put{http::verb::put, url->target(), 11};
  beast::error_code ec;
  put.body().open(request.file.c_str(), beast::file_mode::scan, ec);
  if (ec) {
    return absl::InternalError(fmt::format("{}: {}", request.file.string(), ec.message()));
  }
  std::string host_header =
      (url->host().find(':') != std::string::npos ? "[" + url->host() + "]" : url->host());
  if (url->port() != (tls ? 443 : 80)) host_header += ":" + std::to_string(url->port());
  put.set(http::field::host, host_header);
  put.set(http::field::user_agent, "bcd/" BCD_VERSION);
  for (const auto& [name, value] : request.headers) put.set(name, value);
  put.prepare_payload();  // Content-Length from the file's size

  net::io_context ioc;
  tcp::resolver resolver(ioc);
  tcp::resolver::results_type endpoints =
      resolver.resolve(url->host(), std::to_string(url->port()), ec);
  if (ec) {
    return absl::UnavailableError(fmt::format("upload to {}: {}", url->host(), ec.message()));
  }
  auto connect = [&](beast::tcp_stream& stream) -> absl::Status {
    stream.expires_after(request.timeout);
    beast::error_code failed;
    stream.async_connect(endpoints, [&](beast::error_code e, const tcp::endpoint&) { failed = e; });
    ioc.run();
    if (failed) {
      return absl::UnavailableError(fmt::format("upload to {}: {}", url->host(), failed.message()));
    }
    return absl::OkStatus();
  };
  if (!tls) {
    beast::tcp_stream stream(ioc);
    if (absl::Status s = connect(stream); !s.ok()) return s;
    return Exchange(stream, ioc, put, url->host());
  }
  ssl::context context(ssl::context::tls_client);
  SSL_CTX_set_min_proto_version(context.native_handle(), TLS1_3_VERSION);
  context.set_default_verify_paths();
  context.set_verify_mode(ssl::verify_peer);
  beast::ssl_stream<beast::tcp_stream> stream(ioc, context);
  SSL_set_tlsext_host_name(stream.native_handle(), url->host().c_str());
  SSL_set1_host(stream.native_handle(), url->host().c_str());
  if (absl::Status s = connect(beast::get_lowest_layer(stream)); !s.ok()) return s;
  beast::error_code failed;
  stream.async_handshake(ssl::stream_base::client, [&](beast::error_code e) { failed = e; });
  ioc.restart();
  ioc.run();
  if (failed) {
    return absl::UnavailableError(
        fmt::format("upload to {}: TLS: {}", url->host(), failed.message()));
  }
  return Exchange(stream, ioc, put, url->host());
}

}  // namespace bcd
