#include "transport/websocket.h"

// Boost 1.74 with g++ 12 in C++20 needs <utility> before the Asio headers.
#include <utility>
// clang-format off
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
// clang-format on
#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <atomic>
#include <cctype>
#include <future>
#include <list>
#include <mutex>
#include <thread>

#include "absl/strings/ascii.h"
#include "bettercompute/agent/v1/session.pb.h"
#include "fmt/format.h"
#include "proto/absl_compat.h"
#include "proto/frame_codec.h"
#include "transport/tls.h"
#include "transport/ws_auth.h"

namespace bcd::transport {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;
using WsStream = websocket::stream<beast::ssl_stream<beast::tcp_stream>>;
namespace v1 = bettercompute::agent::v1;

using Done = std::function<void(beast::error_code)>;

// An io_context with one thread of its own: every operation on a connection runs there, so Beast
// sees one strand while callers block on their own threads.
class IoThread {
 public:
  IoThread() : guard_(net::make_work_guard(ioc_)), thread_([this] { ioc_.run(); }) {}
  ~IoThread() { Stop(); }
  void Stop() {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (!thread_.joinable()) return;
    guard_.reset();
    ioc_.stop();
    thread_.join();
  }
  net::io_context& ioc() { return ioc_; }
  void Post(std::function<void()> fn) { net::post(ioc_, std::move(fn)); }
  // Runs `start` on the io thread; it begins an operation and calls `done` once when it ends.
  // Blocks until then.
  beast::error_code Await(std::function<void(Done)> start) {
    auto promise = std::make_shared<std::promise<beast::error_code>>();
    std::future<beast::error_code> future = promise->get_future();
    net::post(ioc_, [start = std::move(start), promise] {
      start([promise](beast::error_code ec) { promise->set_value(ec); });
    });
    try {
      return future.get();
    } catch (const std::future_error&) {
      return net::error::operation_aborted;  // the io thread stopped first
    }
  }

 private:
  net::io_context ioc_;
  net::executor_work_guard<net::io_context::executor_type> guard_;
  std::mutex stop_mu_;
  std::thread thread_;
};

template <class Fields>
std::map<std::string, std::string> HeaderMap(const Fields& fields) {
  std::map<std::string, std::string> out;
  for (const auto& field : fields) {
    out[absl::AsciiStrToLower(
        absl::string_view(field.name_string().data(), field.name_string().size()))] =
        std::string(field.value().data(), field.value().size());
  }
  return out;
}

std::string HostHeader(const std::string& host, uint16_t port) {
  std::string text = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  if (port != 443) text += ":" + std::to_string(port);
  return text;
}

Refusal Unavailable(std::string message, std::string reason = "") {
  Refusal refusal;
  refusal.code = grpc::StatusCode::UNAVAILABLE;
  refusal.reason = std::move(reason);
  refusal.message = std::move(message);
  return refusal;
}

// TLS verification of the gateway (or of the inspecting proxy), per connection.
struct TlsTrust {
  std::string pin;               // pinned serving CA (when no proxy CA)
  std::string server_name;       // the name the leaf must carry
  std::function<int64_t()> now;  // what the certificates' validity is checked against
  std::string failure;           // why the last verification failed
};

int PinnedVerify(X509_STORE_CTX* store, void* arg) {
  auto* trust = static_cast<TlsTrust*>(arg);
  std::vector<pki::Certificate> chain;
  STACK_OF(X509)* untrusted = X509_STORE_CTX_get0_untrusted(store);
  for (int i = 0; untrusted != nullptr && i < sk_X509_num(untrusted); ++i) {
    X509* cert = sk_X509_value(untrusted, i);
    unsigned char* der = nullptr;
    int length = i2d_X509(cert, &der);
    if (length <= 0) break;
    absl::StatusOr<pki::Certificate> parsed =
        pki::Certificate::FromDer(std::string_view(reinterpret_cast<char*>(der), length));
    OPENSSL_free(der);
    if (parsed.ok()) chain.push_back(*std::move(parsed));
  }
  absl::Status status =
      trust->now ? CheckPinnedChain(chain, trust->pin, trust->server_name, trust->now())
                 : absl::InternalError("no clock to check the gateway's certificates against");
  if (status.ok()) return 1;
  trust->failure = std::string(ToStd(status.message()));
  X509_STORE_CTX_set_error(store, X509_V_ERR_APPLICATION_VERIFICATION);
  return 0;
}

// The client's TLS context: TLS 1.3, and either the pin or the proxy CAs (never system roots).
absl::StatusOr<std::shared_ptr<ssl::context>> ClientContext(const WebSocketSpec& spec,
                                                            TlsTrust* trust) {
  auto context = std::make_shared<ssl::context>(ssl::context::tls_client);
  SSL_CTX_set_min_proto_version(context->native_handle(), TLS1_3_VERSION);
  context->set_verify_mode(ssl::verify_peer);
  if (spec.proxy_ca_pem) {
    absl::StatusOr<std::vector<pki::Certificate>> cas = pki::ParsePemChain(*spec.proxy_ca_pem);
    if (!cas.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("proxy_ca_file: {}", ToStd(cas.status().message())));
    }
    X509_STORE* store = SSL_CTX_get_cert_store(context->native_handle());
    for (const pki::Certificate& ca : *cas) X509_STORE_add_cert(store, ca.get());
  } else {
    trust->pin = spec.ca_spki_sha256;
    trust->server_name = spec.server_name;
    trust->now = spec.now;
    SSL_CTX_set_cert_verify_callback(context->native_handle(), PinnedVerify, trust);
  }
  return context;
}

// One WebSocket (or, before the upgrade, one TLS connection), client or server.
class Connection final : public WsConnection {
 public:
  explicit Connection(std::shared_ptr<ssl::context> context)
      : context_(std::move(context)), ws_(io_.ioc(), *context_) {}
  ~Connection() override {
    Abort();
    io_.Stop();
  }

  IoThread& io() { return io_; }
  WsStream& ws() { return ws_; }
  tcp::resolver& resolver() { return resolver_; }
  // One step of a dial or handshake on the io thread, refused once the connection was aborted
  // (an Abort that came before the step started would otherwise be missed).
  beast::error_code Step(std::function<void(Done)> start) {
    return io_.Await([this, start = std::move(start)](Done done) {
      if (aborted_.load()) return done(net::error::operation_aborted);
      start(std::move(done));
    });
  }

  bool Read(std::string* message, bool* text) override {
    beast::flat_buffer buffer;
    bool got_text = false;
    beast::error_code ec = io_.Await([&](Done done) {
      ws_.async_read(buffer, [this, &got_text, done](beast::error_code ec, std::size_t) {
        if (!ec) got_text = ws_.got_text();
        if (ec == websocket::error::closed) {
          std::lock_guard<std::mutex> lock(mu_);
          closed_by_peer_ = true;
          close_code_ = ws_.reason().code;
          close_reason_ = std::string(ws_.reason().reason.c_str());
        }
        done(ec);
      });
    });
    if (ec) {
      std::lock_guard<std::mutex> lock(mu_);
      if (end_.empty()) end_ = ec.message();
      return false;
    }
    *text = got_text;
    *message = beast::buffers_to_string(buffer.data());
    return true;
  }
  bool WriteBinary(std::string_view message) override { return Write(message, true); }
  bool WriteText(std::string_view message) override { return Write(message, false); }
  bool WriteRaw(std::string_view bytes) override {
    std::lock_guard<std::mutex> lock(write_mu_);
    return !io_.Await([&](Done done) {
      net::async_write(ws_.next_layer(), net::buffer(bytes.data(), bytes.size()),
                       [done](beast::error_code ec, std::size_t) { done(ec); });
    });
  }
  void Close(uint16_t code, std::string_view reason) override { StartClose(code, reason); }
  // Starts the close handshake (once per connection) and waits up to `timeout` for it to end.
  void CloseAndWait(uint16_t code, std::string_view reason, std::chrono::milliseconds timeout) {
    StartClose(code, reason).wait_for(timeout);
  }
  void Abort() override {
    aborted_.store(true);
    io_.Post([this] {
      resolver_.cancel();
      beast::error_code ignored;
      beast::get_lowest_layer(ws_).socket().shutdown(tcp::socket::shutdown_both, ignored);
      beast::get_lowest_layer(ws_).close();
    });
  }
  bool closed_by_peer() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_by_peer_;
  }
  int peer_close_code() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_by_peer_ ? close_code_ : 0;
  }
  // How the connection ended: the peer's close code and reason, or the error.
  std::optional<std::pair<uint16_t, std::string>> peer_close() const {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_by_peer_) return std::nullopt;
    return std::make_pair(close_code_, close_reason_);
  }
  std::string end() const {
    std::lock_guard<std::mutex> lock(mu_);
    return end_;
  }

 private:
  bool Write(std::string_view message, bool binary) {
    std::lock_guard<std::mutex> lock(write_mu_);
    return !io_.Await([&](Done done) {
      ws_.binary(binary);
      ws_.async_write(net::buffer(message.data(), message.size()),
                      [done](beast::error_code ec, std::size_t) { done(ec); });
    });
  }

  // The close frame goes once, however many callers ask (a failed read and a stop, say).
  std::shared_future<void> StartClose(uint16_t code, std::string_view reason) {
    std::lock_guard<std::mutex> lock(mu_);
    if (close_done_.valid()) return close_done_;
    auto promise = std::make_shared<std::promise<void>>();
    close_done_ = promise->get_future().share();
    std::string text(reason.substr(0, 120));
    io_.Post([this, code, text, promise] {
      if (!ws_.is_open()) return promise->set_value();
      ws_.async_close(websocket::close_reason(static_cast<websocket::close_code>(code), text),
                      [promise](beast::error_code) { promise->set_value(); });
    });
    return close_done_;
  }

  std::shared_ptr<ssl::context> context_;
  IoThread io_;
  WsStream ws_;
  tcp::resolver resolver_{io_.ioc()};
  std::shared_future<void> close_done_;  // guarded by mu_
  std::atomic<bool> aborted_{false};
  std::mutex write_mu_;
  mutable std::mutex mu_;
  bool closed_by_peer_ = false;  // guarded by mu_
  uint16_t close_code_ = 0;      // guarded by mu_
  std::string close_reason_;     // guarded by mu_
  std::string end_;              // guarded by mu_
};

// TCP (through the proxy when one applies) and TLS, as a client, on `c`. Sets SNI and the name to
// verify. The returned refusal names what failed; nullopt when connected.
std::optional<Refusal> DialTls(Connection& c, const WebSocketSpec& spec, TlsTrust& trust) {
  absl::StatusOr<std::optional<ProxySpec>> proxy = ProxyFor(spec.host, spec.port, spec.env);
  if (!proxy.ok()) return Unavailable(std::string(ToStd(proxy.status().message())), "proxy");
  std::string connect_host = *proxy ? (*proxy)->host : spec.host;
  uint16_t connect_port = *proxy ? (*proxy)->port : spec.port;
  std::string where = *proxy ? fmt::format("the proxy {}", (*proxy)->display)
                             : fmt::format("{}:{}", spec.host, spec.port);
  auto& tcp_stream = beast::get_lowest_layer(c.ws());
  tcp::resolver::results_type endpoints;
  beast::error_code ec = c.Step([&](Done done) {
    c.resolver().async_resolve(
        connect_host, std::to_string(connect_port),
        [&, done](beast::error_code ec, tcp::resolver::results_type results) {
          endpoints = std::move(results);
          done(ec);
        });
  });
  if (ec) return Unavailable(fmt::format("cannot resolve {}: {}", where, ec.message()));
  ec = c.Step([&](Done done) {
    tcp_stream.expires_after(spec.dial_timeout);
    tcp_stream.async_connect(endpoints,
                             [done](beast::error_code ec, const tcp::endpoint&) { done(ec); });
  });
  if (ec) return Unavailable(fmt::format("cannot connect to {}: {}", where, ec.message()));
  if (*proxy) {
    std::string authority =
        (spec.host.find(':') != std::string::npos ? "[" + spec.host + "]" : spec.host) + ":" +
        std::to_string(spec.port);
    http::request<http::empty_body> request{http::verb::connect, authority, 11};
    request.set(http::field::host, authority);
    request.set(http::field::user_agent, "bcd/" BCD_VERSION);
    if (!(*proxy)->authorization.empty()) {
      request.set(http::field::proxy_authorization, (*proxy)->authorization);
    }
    beast::flat_buffer buffer;
    http::response_parser<http::empty_body> parser;
    parser.skip(true);  // a CONNECT answer has no body, whatever its headers say
    ec = c.Step([&](Done done) {
      http::async_write(tcp_stream, request, [&, done](beast::error_code ec, std::size_t) {
        if (ec) return done(ec);
        http::async_read_header(tcp_stream, buffer, parser,
                                [done](beast::error_code ec, std::size_t) { done(ec); });
      });
    });
    if (ec) return Unavailable(fmt::format("{}: {}", where, ec.message()), "proxy");
    unsigned status = parser.get().result_int();
    if (status != 200) {
      // 407 is the standard answer; tinyproxy, for one, answers CONNECT with 401.
      bool auth = status == 407 || status == 401;
      std::string why = !auth ? ""
                        : (*proxy)->authorization.empty()
                            ? " (it wants credentials: put them in the proxy URL)"
                            : " (it refused the credentials)";
      return Unavailable(fmt::format("{} answered CONNECT with {}{}", where, status, why), "proxy");
    }
    if (buffer.size() != 0) {
      return Unavailable(fmt::format("{} sent bytes before the TLS handshake", where), "proxy");
    }
  }
  SSL* ssl_handle = c.ws().next_layer().native_handle();
  if (!IpBytes(spec.server_name)) SSL_set_tlsext_host_name(ssl_handle, spec.server_name.c_str());
  if (spec.proxy_ca_pem) {
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl_handle);
    if (IpBytes(spec.host)) {
      X509_VERIFY_PARAM_set1_ip_asc(param, spec.host.c_str());
    } else {
      X509_VERIFY_PARAM_set1_host(param, spec.host.c_str(), spec.host.size());
    }
  }
  ec = c.Step(
      [&](Done done) { c.ws().next_layer().async_handshake(ssl::stream_base::client, done); });
  if (ec) {
    std::string why = !trust.failure.empty() ? trust.failure : ec.message();
    if (spec.proxy_ca_pem && trust.failure.empty()) {
      long verify = SSL_get_verify_result(ssl_handle);
      if (verify != X509_V_OK) {
        why = fmt::format("the certificate is not from proxy_ca_file's CAs for {}: {}", spec.host,
                          X509_verify_cert_error_string(verify));
      }
    }
    return Unavailable(fmt::format("TLS with {}: {}", where, why), "tls");
  }
  return std::nullopt;
}

// The session stream: dials on its own io thread, then carries frames.
class WsFrameStream final : public FrameStream {
 public:
  WsFrameStream(const WebSocketSpec& spec, absl::StatusOr<WsNodeIdentity> identity,
                std::function<int64_t()> now)
      : spec_(spec), now_(std::move(now)) {
    dialer_ = std::thread([this, identity = std::move(identity)]() mutable {
      std::optional<Refusal> failed = Dial(identity);
      std::lock_guard<std::mutex> lock(mu_);
      dialed_ = true;
      refusal_ = std::move(failed);
      cv_.notify_all();
    });
  }
  ~WsFrameStream() override {
    Cancel();
    if (dialer_.joinable()) dialer_.join();
    connection_.reset();
  }

  bool Read(v1::ServerFrame* frame) override {
    if (!WaitDialed()) return false;
    std::string message;
    bool text = false;
    if (!connection_->Read(&message, &text)) return false;
    if (text) {
      return Fail(1003, "protocol-error",
                  "the gateway sent a text message: frames come in binary messages");
    }
    if (absl::Status s = proto::DecodeMessage(message, frame); !s.ok()) {
      return Fail(1007, "protocol-error",
                  fmt::format("the gateway sent a malformed frame: {}", ToStd(s.message())));
    }
    return true;
  }
  bool Write(const v1::AgentFrame& frame) override {
    if (!WaitDialed()) return false;
    absl::StatusOr<std::string> bytes = proto::EncodeMessage(frame);
    if (!bytes.ok()) return false;
    return connection_->WriteBinary(*bytes);
  }
  void CloseSend() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (dialed_ && !refusal_ && connection_) {
      connection_->Close(static_cast<uint16_t>(websocket::close_code::normal), "bcd stopping");
    } else {
      cancelled_ = true;
      if (connection_) connection_->Abort();
    }
  }
  void Cancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    if (connection_) connection_->Abort();
  }
  Refusal Finish() override {
    WaitDialed();
    std::lock_guard<std::mutex> lock(mu_);
    if (refusal_) return *refusal_;
    Refusal refusal;
    std::optional<std::pair<uint16_t, std::string>> close = connection_->peer_close();
    if (close && close->first == static_cast<uint16_t>(websocket::close_code::normal)) {
      return refusal;  // a clean end
    }
    refusal.code = grpc::StatusCode::UNAVAILABLE;
    refusal.message =
        close ? fmt::format("the gateway closed the WebSocket ({} {})", close->first, close->second)
              : fmt::format("the WebSocket ended: {}", connection_->end());
    return refusal;
  }

 private:
  bool WaitDialed() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return dialed_; });
    return !refusal_;
  }
  bool Fail(uint16_t code, std::string reason, std::string message) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      Refusal refusal = Unavailable(message, std::move(reason));
      refusal_ = refusal;
    }
    // The close handshake gets a moment before the stream (and its socket) goes.
    connection_->CloseAndWait(code, message, std::chrono::seconds(1));
    return false;
  }

  std::optional<Refusal> Dial(const absl::StatusOr<WsNodeIdentity>& identity) {
    if (!identity.ok()) {
      return Unavailable(fmt::format("the node identity: {}", ToStd(identity.status().message())));
    }
    auto trust = std::make_shared<TlsTrust>();
    absl::StatusOr<std::shared_ptr<ssl::context>> context = ClientContext(spec_, trust.get());
    if (!context.ok()) return Unavailable(std::string(ToStd(context.status().message())));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cancelled_) return Unavailable("cancelled");
      connection_ = std::make_unique<Connection>(*context);
      trust_ = trust;
    }
    Connection& c = *connection_;
    if (std::optional<Refusal> failed = DialTls(c, spec_, *trust)) return failed;
    absl::StatusOr<NodeUpgradeHeaders> headers =
        MakeNodeUpgradeHeaders(identity->key, identity->chain, spec_.host, now_());
    if (!headers.ok()) return Unavailable(std::string(ToStd(headers.status().message())));
    WsStream& ws = c.ws();
    ws.set_option(websocket::stream_base::decorator(
        [fields = headers->headers](websocket::request_type& request) {
          request.set(http::field::sec_websocket_protocol, std::string(kWsSubprotocol));
          request.set(http::field::user_agent, "bcd/" BCD_VERSION);
          for (const auto& [name, value] : fields) request.set(name, value);
        }));
    websocket::stream_base::timeout timeouts{};
    timeouts.handshake_timeout = spec_.dial_timeout;
    timeouts.idle_timeout = spec_.keepalive_time * 2;
    timeouts.keep_alive_pings = true;
    ws.set_option(timeouts);
    ws.read_message_max(kMaxWsMessage);
    ws.auto_fragment(false);
    websocket::response_type response;
    beast::error_code ec = c.Step([&](Done done) {
      beast::get_lowest_layer(ws).expires_never();  // the WebSocket's own timers take over
      ws.async_handshake(response, HostHeader(spec_.host, spec_.port), spec_.path, done);
    });
    std::map<std::string, std::string> answer = HeaderMap(response);
    if (ec == websocket::error::upgrade_declined) {
      return RefusalOfHttp(
          response.result_int(), answer,
          fmt::format("the gateway declined the WebSocket upgrade ({} {})", response.result_int(),
                      std::string(response.reason().data(), response.reason().size())));
    }
    if (ec) return Unavailable(fmt::format("the WebSocket handshake: {}", ec.message()));
    auto refuse = [&](std::string why) {
      // Closed before any frame is read: nothing from this peer is believed.
      c.Close(static_cast<uint16_t>(websocket::close_code::policy_error), "unproven gateway");
      Refusal refusal;
      refusal.code = grpc::StatusCode::UNAUTHENTICATED;
      refusal.reason = "gateway-proof";
      refusal.message = std::move(why);
      return refusal;
    };
    if (answer["sec-websocket-protocol"] != kWsSubprotocol) {
      return refuse(fmt::format("the gateway did not select the {} subprotocol", kWsSubprotocol));
    }
    GatewayProofCheck check{.ca_spki_sha256 = spec_.ca_spki_sha256,
                            .server_name = spec_.server_name,
                            .node_id = identity->node_id,
                            .nonce = headers->nonce,
                            .now = now_()};
    if (absl::Status s = VerifyGatewayProof(answer["x-bc-gateway-proof"], check); !s.ok()) {
      return refuse(std::string(ToStd(s.message())));
    }
    return std::nullopt;
  }

  WebSocketSpec spec_;
  std::function<int64_t()> now_;
  std::thread dialer_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool dialed_ = false;              // guarded by mu_
  bool cancelled_ = false;           // guarded by mu_
  std::optional<Refusal> refusal_;   // guarded by mu_
  std::shared_ptr<TlsTrust> trust_;  // guarded by mu_
  // Set once by the dialer (under mu_), then used without the lock by Read/Write after dialed_.
  std::unique_ptr<Connection> connection_;
};

// ---- the server half ----

// The exchange hands the handler a view of the connection the listener owns.
class ConnectionView final : public WsConnection {
 public:
  explicit ConnectionView(std::shared_ptr<Connection> c) : c_(std::move(c)) {}
  bool Read(std::string* message, bool* text) override { return c_->Read(message, text); }
  bool WriteBinary(std::string_view message) override { return c_->WriteBinary(message); }
  bool WriteText(std::string_view message) override { return c_->WriteText(message); }
  bool WriteRaw(std::string_view bytes) override { return c_->WriteRaw(bytes); }
  void Close(uint16_t code, std::string_view reason) override { c_->Close(code, reason); }
  void Abort() override { c_->Abort(); }
  bool closed_by_peer() const override { return c_->closed_by_peer(); }
  int peer_close_code() const override { return c_->peer_close_code(); }

 private:
  std::shared_ptr<Connection> c_;
};

class ServerExchange final : public WsExchange {
 public:
  ServerExchange(std::shared_ptr<Connection> c, HttpRequestInfo info,
                 http::request<http::string_body> request, std::size_t max_message)
      : c_(std::move(c)),
        info_(std::move(info)),
        request_(std::move(request)),
        max_message_(max_message) {}
  const HttpRequestInfo& request() const override { return info_; }
  void Answer(const HttpAnswer& answer) override {
    http::response<http::string_body> response{static_cast<http::status>(answer.status), 11};
    for (const auto& [name, value] : answer.headers) response.set(name, value);
    response.set(http::field::connection, "close");
    response.body() = answer.body;
    response.prepare_payload();
    c_->Step([&](Done done) {
      http::async_write(c_->ws().next_layer(), response,
                        [done](beast::error_code ec, std::size_t) { done(ec); });
    });
    c_->Step([&](Done done) { c_->ws().next_layer().async_shutdown(done); });
  }
  std::unique_ptr<WsConnection> Accept(
      const std::vector<std::pair<std::string, std::string>>& headers) override {
    WsStream& ws = c_->ws();
    ws.set_option(websocket::stream_base::decorator([headers](websocket::response_type& response) {
      response.set(http::field::sec_websocket_protocol, std::string(kWsSubprotocol));
      for (const auto& [name, value] : headers) response.set(name, value);
    }));
    ws.set_option(websocket::stream_base::timeout::suggested(beast::role_type::server));
    ws.read_message_max(max_message_);
    beast::error_code ec = c_->Step([&](Done done) {
      beast::get_lowest_layer(ws).expires_never();
      ws.async_accept(request_, done);
    });
    if (ec) return nullptr;
    return std::make_unique<ConnectionView>(c_);
  }

 private:
  std::shared_ptr<Connection> c_;
  HttpRequestInfo info_;
  http::request<http::string_body> request_;
  std::size_t max_message_;
};

class Listener final : public WsListener {
 public:
  Listener(Options options, std::function<void(WsExchange&)> handler)
      : options_(std::move(options)), handler_(std::move(handler)), acceptor_(io_.ioc()) {}
  ~Listener() override {
    io_.Await([&](Done done) {
      beast::error_code ignored;
      acceptor_.close(ignored);
      done({});
    });
    std::list<Worker> threads;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      for (auto& c : connections_) c->Abort();
      threads.swap(threads_);
    }
    for (Worker& w : threads) w.thread.join();
    io_.Stop();
  }

  absl::Status Listen() {
    context_ = std::make_shared<ssl::context>(ssl::context::tls_server);
    SSL_CTX_set_min_proto_version(context_->native_handle(), TLS1_3_VERSION);
    beast::error_code ec;
    context_->use_certificate_chain(net::buffer(options_.chain_pem), ec);
    if (!ec) context_->use_private_key(net::buffer(options_.key_pem), ssl::context::pem, ec);
    if (ec) return absl::InvalidArgumentError("the serving key or chain: " + ec.message());
    tcp::endpoint endpoint(net::ip::make_address(options_.host, ec), options_.port);
    if (ec) return absl::InvalidArgumentError("listen address: " + ec.message());
    ec = io_.Await([&](Done done) {
      beast::error_code e;
      acceptor_.open(endpoint.protocol(), e);
      // Asio opens sockets without close-on-exec: nothing a child of this process runs may
      // inherit the listener.
      if (!e) fcntl(acceptor_.native_handle(), F_SETFD, FD_CLOEXEC);
      if (!e) acceptor_.set_option(net::socket_base::reuse_address(true), e);
      if (!e) acceptor_.bind(endpoint, e);
      if (!e) acceptor_.listen(net::socket_base::max_listen_connections, e);
      if (!e) port_ = acceptor_.local_endpoint().port();
      done(e);
    });
    if (ec) return absl::UnavailableError("cannot listen: " + ec.message());
    io_.Post([this] { AcceptNext(); });
    return absl::OkStatus();
  }
  uint16_t port() const override { return port_; }

 private:
  void AcceptNext() {
    auto c = std::make_shared<Connection>(context_);
    acceptor_.async_accept(c->io().ioc(), [this, c](beast::error_code ec, tcp::socket socket) {
      if (ec) return;  // closed
      fcntl(socket.native_handle(), F_SETFD, FD_CLOEXEC);
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      beast::get_lowest_layer(c->ws()).socket() = std::move(socket);
      connections_.push_back(c);
      // Threads of connections that ended are joined here, so a long-lived listener keeps
      // only the live ones.
      for (auto it = threads_.begin(); it != threads_.end();) {
        if (it->done->load()) {
          it->thread.join();
          it = threads_.erase(it);
        } else {
          ++it;
        }
      }
      auto done = std::make_shared<std::atomic<bool>>(false);
      threads_.push_back({std::thread([this, c, done] {
                            Serve(c);
                            done->store(true);
                          }),
                          done});
      AcceptNext();
    });
  }

  void Serve(std::shared_ptr<Connection> c) {
    auto& tcp_stream = beast::get_lowest_layer(c->ws());
    beast::flat_buffer buffer;
    http::request_parser<http::string_body> parser;
    parser.body_limit(options_.max_body);
    beast::error_code ec = c->Step([&](Done done) {
      tcp_stream.expires_after(std::chrono::seconds(10));
      c->ws().next_layer().async_handshake(
          ssl::stream_base::server, [&, done](beast::error_code ec) {
            if (ec) return done(ec);
            http::async_read(c->ws().next_layer(), buffer, parser,
                             [done](beast::error_code ec, std::size_t) { done(ec); });
          });
    });
    if (!ec) {
      http::request<http::string_body> request = parser.release();
      HttpRequestInfo info;
      info.method = std::string(request.method_string());
      info.target = std::string(request.target());
      info.headers = HeaderMap(request);
      std::string host = info.headers["host"];
      if (host.starts_with('[')) {
        host = host.substr(1, host.find(']') - 1);
      } else if (std::size_t colon = host.rfind(':'); colon != std::string::npos) {
        host = host.substr(0, colon);
      }
      info.host = host;
      info.body = request.body();
      info.upgrade = websocket::is_upgrade(request);
      ServerExchange exchange(c, std::move(info), std::move(request), options_.max_message);
      handler_(exchange);
    }
    c->Abort();
    std::lock_guard<std::mutex> lock(mu_);
    connections_.remove(c);
  }

  Options options_;
  std::function<void(WsExchange&)> handler_;
  IoThread io_;
  tcp::acceptor acceptor_;
  std::shared_ptr<ssl::context> context_;
  uint16_t port_ = 0;
  std::mutex mu_;
  bool stopping_ = false;                               // guarded by mu_
  std::list<std::shared_ptr<Connection>> connections_;  // guarded by mu_
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::list<Worker> threads_;  // guarded by mu_
};

}  // namespace

WebSocketTransport::WebSocketTransport(WebSocketSpec spec,
                                       std::function<absl::StatusOr<WsNodeIdentity>()> identity)
    : spec_(std::move(spec)), identity_(std::move(identity)) {}

absl::StatusOr<std::unique_ptr<FrameStream>> WebSocketTransport::OpenSession() {
  absl::StatusOr<WsNodeIdentity> identity = identity_();
  if (!identity.ok()) return identity.status();
  return std::unique_ptr<FrameStream>(new WsFrameStream(spec_, std::move(identity), spec_.now));
}

absl::StatusOr<HttpAnswer> HttpsPost(const WebSocketSpec& spec, std::string_view target,
                                     std::string_view content_type, std::string_view body,
                                     std::size_t max_answer) {
  TlsTrust trust;
  absl::StatusOr<std::shared_ptr<ssl::context>> context = ClientContext(spec, &trust);
  if (!context.ok()) return context.status();
  Connection c(*context);
  if (std::optional<Refusal> failed = DialTls(c, spec, trust)) {
    return absl::UnavailableError(failed->message);
  }
  http::request<http::string_body> request{http::verb::post, std::string(target), 11};
  request.set(http::field::host, HostHeader(spec.host, spec.port));
  request.set(http::field::user_agent, "bcd/" BCD_VERSION);
  request.set(http::field::content_type, std::string(content_type));
  request.body() = std::string(body);
  request.prepare_payload();
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(max_answer);
  beast::error_code ec = c.Step([&](Done done) {
    beast::get_lowest_layer(c.ws()).expires_after(spec.dial_timeout);
    http::async_write(c.ws().next_layer(), request, [&, done](beast::error_code ec, std::size_t) {
      if (ec) return done(ec);
      http::async_read(c.ws().next_layer(), buffer, parser,
                       [done](beast::error_code ec, std::size_t) { done(ec); });
    });
  });
  if (ec) {
    return absl::UnavailableError(
        fmt::format("POST {} to {}: {}", target, HostHeader(spec.host, spec.port), ec.message()));
  }
  HttpAnswer answer;
  answer.status = parser.get().result_int();
  answer.headers = HeaderMap(parser.get());
  answer.body = parser.get().body();
  return answer;
}

absl::StatusOr<std::unique_ptr<WsListener>> WsListener::Start(
    Options options, std::function<void(WsExchange&)> handler) {
  auto listener = std::make_unique<Listener>(std::move(options), std::move(handler));
  if (absl::Status s = listener->Listen(); !s.ok()) return s;
  return std::unique_ptr<WsListener>(std::move(listener));
}

}  // namespace bcd::transport
