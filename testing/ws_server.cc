#include "testing/ws_server.h"

#include "transport/ws_connection.h"
// (ws_connection.h first: Boost 1.74 needs <utility> before Asio.)
#include <fcntl.h>
#include <openssl/ssl.h>

#include <atomic>
#include <list>
#include <mutex>
#include <thread>

#include "transport/ws_auth.h"

namespace bcd::testing {
namespace {

using namespace transport::wsio;  // NOLINT(google-build-using-namespace): the Beast aliases
using transport::HttpAnswer;

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
      response.set(http::field::sec_websocket_protocol, std::string(transport::kWsSubprotocol));
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

absl::StatusOr<std::unique_ptr<WsListener>> WsListener::Start(
    Options options, std::function<void(WsExchange&)> handler) {
  auto listener = std::make_unique<Listener>(std::move(options), std::move(handler));
  if (absl::Status s = listener->Listen(); !s.ok()) return s;
  return std::unique_ptr<WsListener>(std::move(listener));
}

}  // namespace bcd::testing
