#include "transport/websocket.h"

#include "base/mutex.h"
#include "base/version.h"
#include "transport/ws_connection.h"
// (ws_connection.h first: Boost 1.74 needs <utility> before Asio.)
#include <arpa/inet.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <atomic>
#include <cctype>
#include <mutex>
#include <thread>

#include "bettercompute/agent/v1/session.pb.h"
#include "fmt/format.h"
#include "proto/absl_compat.h"
#include "proto/frame_codec.h"
#include "transport/tls.h"
#include "transport/ws_auth.h"

namespace bcd::transport {
namespace {

using namespace wsio;  // NOLINT(google-build-using-namespace): the Beast aliases of this file
namespace v1 = bettercompute::agent::v1;

// A RenewResponse is a chain of a few certificates.
constexpr std::size_t kMaxRenewAnswer = 256 * 1024;

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
  std::string pin;          // pinned serving CA (when no proxy CA)
  std::string server_name;  // the name the leaf must carry
  UnixClock now;            // what the certificates' validity is checked against
  std::string failure;      // why the last verification failed
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

// Asks the proxy, over `c`'s TCP connection, for a tunnel to the gateway; nullopt when it answered
// 200 and nothing more.
std::optional<Refusal> ProxyConnect(Connection& c, const WebSocketSpec& spec,
                                    const ProxySpec& proxy, const std::string& where) {
  auto& tcp_stream = beast::get_lowest_layer(c.ws());
  std::string authority =
      (spec.host.find(':') != std::string::npos ? "[" + spec.host + "]" : spec.host) + ":" +
      std::to_string(spec.port);
  http::request<http::empty_body> request{http::verb::connect, authority, 11};
  request.set(http::field::host, authority);
  request.set(http::field::user_agent, "bcd/" + std::string(Version()));
  if (!proxy.authorization.empty()) {
    request.set(http::field::proxy_authorization, proxy.authorization);
  }
  beast::flat_buffer buffer;
  http::response_parser<http::empty_body> parser;
  parser.skip(true);  // a CONNECT answer has no body, whatever its headers say
  beast::error_code ec = c.Step([&](Done done) {
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
                      : proxy.authorization.empty()
                          ? " (it wants credentials: put them in the proxy URL)"
                          : " (it refused the credentials)";
    return Unavailable(fmt::format("{} answered CONNECT with {}{}", where, status, why), "proxy");
  }
  if (buffer.size() != 0) {
    return Unavailable(fmt::format("{} sent bytes before the TLS handshake", where), "proxy");
  }
  return std::nullopt;
}

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
    if (std::optional<Refusal> refused = ProxyConnect(c, spec, **proxy, where)) return refused;
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
  WsFrameStream(const WebSocketSpec& spec, absl::StatusOr<WsNodeIdentity> identity, UnixClock now)
      : spec_(spec), now_(std::move(now)) {
    dialer_ = std::thread([this, identity = std::move(identity)]() mutable {
      std::optional<Refusal> failed = Dial(identity);
      MutexLock lock(mu_);
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
    MutexLock lock(mu_);
    if (dialed_ && !refusal_ && connection_) {
      connection_->Close(static_cast<uint16_t>(websocket::close_code::normal), "bcd stopping");
    } else {
      cancelled_ = true;
      if (connection_) connection_->Abort();
    }
  }
  void Cancel() override {
    MutexLock lock(mu_);
    cancelled_ = true;
    if (connection_) connection_->Abort();
  }
  Refusal Finish() override {
    WaitDialed();
    MutexLock lock(mu_);
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
    UniqueLock lock(mu_);
    cv_.wait(lock, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return dialed_; });
    return !refusal_;
  }
  bool Fail(uint16_t code, std::string reason, std::string message) {
    {
      MutexLock lock(mu_);
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
      MutexLock lock(mu_);
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
          request.set(http::field::user_agent, "bcd/" + std::string(Version()));
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
  UnixClock now_;
  std::thread dialer_;
  Mutex mu_;
  CondVar cv_;
  bool dialed_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<Refusal> refusal_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<TlsTrust> trust_ ABSL_GUARDED_BY(mu_);
  // Set once by the dialer (under mu_), then used without the lock by Read/Write after dialed_.
  std::unique_ptr<Connection> connection_;
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

absl::StatusOr<v1::JoinResponse> WebSocketTransport::Join(const v1::JoinRequest&, Refusal*) {
  return absl::UnimplementedError(
      "Join goes over gRPC: the gateway does not serve it on the WebSocket origin");
}

absl::StatusOr<v1::RenewResponse> WebSocketTransport::Renew(const v1::RenewRequest& request,
                                                            Refusal* refusal) {
  absl::StatusOr<std::string> body = proto::EncodeMessage(request);
  if (!body.ok()) return body.status();
  absl::StatusOr<HttpAnswer> answer =
      HttpsPost(spec_, "/v1/renew", "application/x-protobuf", *body, kMaxRenewAnswer);
  if (!answer.ok())
    return absl::UnavailableError("renew: " + std::string(ToStd(answer.status().message())));
  if (answer->status != 200) {
    std::string text = answer->body.substr(0, 200);
    for (char& c : text) {
      if (!std::isprint(static_cast<unsigned char>(c))) c = '?';
    }
    Refusal why = RefusalOfHttp(answer->status, answer->headers,
                                fmt::format("HTTP {} {}", answer->status, text));
    if (refusal != nullptr) *refusal = why;
    return absl::UnavailableError("renew " + why.ToString());
  }
  v1::RenewResponse response;
  if (absl::Status s = proto::DecodeMessage(answer->body, &response); !s.ok()) {
    return absl::UnavailableError(
        fmt::format("renew: the answer is not a RenewResponse: {}", ToStd(s.message())));
  }
  return response;
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
  request.set(http::field::user_agent, "bcd/" + std::string(Version()));
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

}  // namespace bcd::transport
