#pragma once

// The instance metadata service of a VPS host ([imds] listen, node mode): an HTTP server that
// answers the running instance holding the request's source address, among the instances the
// desired state's vps section lists. Session tokens in the IMDSv2 style protect it:
//
//   PUT /v1/api/token         X-BC-Metadata-Token-TTL-Seconds: 1..21600  -> a token
//   GET /v1/meta-data         X-BC-Metadata-Token: ...  -> {"instance_id", "hostname", "addresses"}
//   GET /v1/user-data         ...  -> the user data (a secret bound to the instance's allocation)
//   GET /v1/token?audience=A  ...  -> a workload identity token (a JWT)
//
// A token is good only for the address that asked for it and until its TTL; each address holds at
// most kTokensPerSource (a new one evicts its oldest). The PUT's answer leaves with an IP TTL of 1,
// and a PUT carrying X-Forwarded-For or Forwarded is refused, so a request relayed from inside an
// instance cannot get one. An address no instance holds gets 404.
//
// No instance can hold what others need: the source is checked when a connection is accepted,
// before it takes a slot; each instance has kSlotsPerSource, addresses no instance holds share
// kUnknownSlots; every request has kRequestDeadline to arrive whole and its answer as long to
// leave, or the connection is closed. Stopping closes every connection at once (a fetch of user
// data or a token in flight ends with the session it waits on). Nothing is cached.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/mutex.h"
#include "bettercompute/agent/v1/spec.pb.h"

namespace bcd {

struct ImdsOptions {
  std::string host = "169.254.169.254";
  uint16_t port = 80;  // 0: any free port (tests)
  // The instances the desired state lists now.
  std::function<std::vector<bettercompute::agent::v1::VpsInstance>()> instances;
  std::function<absl::StatusOr<std::string>(const bettercompute::agent::v1::VpsInstance&)>
      user_data;
  std::function<absl::StatusOr<std::string>(const bettercompute::agent::v1::VpsInstance&,
                                            const std::string& audience)>
      token;
  UnixClock now;
  // How long a request may take to arrive whole, and its answer to leave (tests shorten it).
  std::chrono::milliseconds request_deadline = std::chrono::seconds(5);
  // Where requests are counted by answer (the HTTP status, "busy" when no slot was free,
  // "incomplete" when no whole request came in time); none when null.
  Metrics* metrics = nullptr;
};

class ImdsServer {
 public:
  static absl::StatusOr<std::unique_ptr<ImdsServer>> Start(ImdsOptions options, Logger* log);
  ~ImdsServer();
  uint16_t port() const { return port_; }

  static constexpr int64_t kMaxTokenTtl = 21600;
  static constexpr std::size_t kMaxTokens = 4096;
  static constexpr std::size_t kTokensPerSource = 16;
  static constexpr std::size_t kMaxHeaderBytes = 8 * 1024;
  static constexpr int kMaxConcurrent = 16;  // requests of instances served at once
  static constexpr int kSlotsPerSource = 4;  // of those, from one address
  static constexpr int kUnknownSlots = 4;    // requests from addresses no instance holds

  // The answer, as sent, to one request given as its bytes from `peer` ("" when the bytes are
  // not one whole request). The fuzz target drives the request handling through it.
  std::string AnswerBytes(std::string_view bytes, const std::string& peer);

 private:
  ImdsServer(ImdsOptions options, Logger* log) : options_(std::move(options)), log_(log) {
    if (options_.metrics != nullptr) {
      requests_ = &options_.metrics->Counter("bcd_imds_requests_total",
                                             "Metadata-service requests, by answer", {"answer"});
    }
  }
  void Loop();
  struct Parsed;  // a parsed request (Beast stays in imds.cc)
  void Serve(int fd, const std::string& peer, bool known);
  // The serialized answer; `hop_limit_one` is set when it must leave with IP TTL 1.
  std::string Respond(const Parsed& request, const std::string& peer, bool* hop_limit_one);
  std::string IssueToken(const std::string& peer, int64_t ttl, int64_t now);
  void LogUnknownSource(const std::string& peer);

  struct Token {
    std::string address;
    int64_t expires;
    uint64_t issued;  // order of issue
  };
  void Count(std::string_view answer) const {
    if (requests_ != nullptr) requests_->Add({answer});
  }
  ImdsOptions options_;
  CounterFamily* requests_ = nullptr;
  Logger* log_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: stop
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  Mutex mu_;
  std::map<std::string, Token> tokens_ ABSL_GUARDED_BY(mu_);
  uint64_t issued_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int> slots_ ABSL_GUARDED_BY(mu_);  // requests in hand per address
  int known_ ABSL_GUARDED_BY(mu_) = 0, unknown_ = 0;       // requests in hand
  std::set<int> open_ ABSL_GUARDED_BY(mu_);                // their sockets
  std::map<std::string, int64_t> unknown_logged_ ABSL_GUARDED_BY(mu_);  // address -> when logged
  CondVar idle_;                                                        // a request ended
  std::thread thread_;
};

}  // namespace bcd
