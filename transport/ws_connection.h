#pragma once

// The Beast side of a WebSocket connection, shared by the client (websocket.cc) and the dev
// gateway's listener (testing/ws_server.cc). Internal to those two: nothing else includes it, so
// the Beast templates are compiled in two translation units only.

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

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "absl/strings/ascii.h"
#include "base/mutex.h"

namespace bcd::transport::wsio {

namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;
using WsStream = websocket::stream<beast::ssl_stream<beast::tcp_stream>>;
using Done = std::function<void(beast::error_code)>;

// An io_context with one thread of its own: every operation on a connection runs there, so Beast
// sees one strand while callers block on their own threads.
class IoThread {
 public:
  IoThread() : guard_(net::make_work_guard(ioc_)), thread_([this] { ioc_.run(); }) {}
  ~IoThread() { Stop(); }
  void Stop() {
    MutexLock lock(stop_mu_);
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
  Mutex stop_mu_;
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

// One WebSocket (or, before the upgrade, one TLS connection), client or server.
class Connection {
 public:
  explicit Connection(std::shared_ptr<ssl::context> context)
      : context_(std::move(context)), ws_(io_.ioc(), *context_) {}
  ~Connection() {
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

  bool Read(std::string* message, bool* text) {
    beast::flat_buffer buffer;
    bool got_text = false;
    beast::error_code ec = io_.Await([&](Done done) {
      ws_.async_read(buffer, [this, &got_text, done](beast::error_code ec, std::size_t) {
        if (!ec) got_text = ws_.got_text();
        if (ec == websocket::error::closed) {
          MutexLock lock(mu_);
          closed_by_peer_ = true;
          close_code_ = ws_.reason().code;
          close_reason_ = std::string(ws_.reason().reason.c_str());
        }
        done(ec);
      });
    });
    if (ec) {
      MutexLock lock(mu_);
      if (end_.empty()) end_ = ec.message();
      return false;
    }
    *text = got_text;
    *message = beast::buffers_to_string(buffer.data());
    return true;
  }
  bool WriteBinary(std::string_view message) { return Write(message, true); }
  bool WriteText(std::string_view message) { return Write(message, false); }
  bool WriteRaw(std::string_view bytes) {
    MutexLock lock(write_mu_);
    return !io_.Await([&](Done done) {
      net::async_write(ws_.next_layer(), net::buffer(bytes.data(), bytes.size()),
                       [done](beast::error_code ec, std::size_t) { done(ec); });
    });
  }
  void Close(uint16_t code, std::string_view reason) { StartClose(code, reason); }
  // Starts the close handshake (once per connection) and waits up to `timeout` for it to end.
  void CloseAndWait(uint16_t code, std::string_view reason, std::chrono::milliseconds timeout) {
    StartClose(code, reason).wait_for(timeout);
  }
  void Abort() {
    aborted_.store(true);
    io_.Post([this] {
      resolver_.cancel();
      beast::error_code ignored;
      beast::get_lowest_layer(ws_).socket().shutdown(tcp::socket::shutdown_both, ignored);
      beast::get_lowest_layer(ws_).close();
    });
  }
  bool closed_by_peer() const {
    MutexLock lock(mu_);
    return closed_by_peer_;
  }
  int peer_close_code() const {
    MutexLock lock(mu_);
    return closed_by_peer_ ? close_code_ : 0;
  }
  // How the connection ended: the peer's close code and reason, or the error.
  std::optional<std::pair<uint16_t, std::string>> peer_close() const {
    MutexLock lock(mu_);
    if (!closed_by_peer_) return std::nullopt;
    return std::make_pair(close_code_, close_reason_);
  }
  std::string end() const {
    MutexLock lock(mu_);
    return end_;
  }

 private:
  bool Write(std::string_view message, bool binary) {
    MutexLock lock(write_mu_);
    return !io_.Await([&](Done done) {
      ws_.binary(binary);
      ws_.async_write(net::buffer(message.data(), message.size()),
                      [done](beast::error_code ec, std::size_t) { done(ec); });
    });
  }

  // The close frame goes once, however many callers ask (a failed read and a stop, say).
  std::shared_future<void> StartClose(uint16_t code, std::string_view reason) {
    MutexLock lock(mu_);
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
  std::shared_future<void> close_done_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> aborted_{false};
  // Lock order: write_mu_ (one writer at a time) is held while the io thread runs the write, and
  // the io thread's handlers take mu_; mu_ is never held while waiting on the io thread.
  Mutex write_mu_;
  mutable Mutex mu_;
  bool closed_by_peer_ ABSL_GUARDED_BY(mu_) = false;
  uint16_t close_code_ ABSL_GUARDED_BY(mu_) = 0;
  std::string close_reason_ ABSL_GUARDED_BY(mu_);
  std::string end_ ABSL_GUARDED_BY(mu_);
};

}  // namespace bcd::transport::wsio
