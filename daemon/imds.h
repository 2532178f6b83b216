#pragma once

// The instance metadata service of a VPS host ([imds] listen, node mode): an HTTP server that
// answers the running instance holding the request's source address, among the instances the
// desired state's vps section lists. Session tokens in the IMDSv2 style protect it:
//
//   PUT /v1/api/token          X-BC-Metadata-Token-TTL-Seconds: 1..21600   -> a token
//   GET /v1/meta-data          X-BC-Metadata-Token: ...  -> {"instance_id", "hostname",
//   "addresses"} GET /v1/user-data          ...                       -> the user data (a secret
//   bound to the
//                                                           instance's allocation)
//   GET /v1/token?audience=A   ...                       -> a workload identity token (a JWT)
//
// A token is good only for the address that asked for it and until its TTL. The PUT's answer
// leaves with an IP TTL of 1, and a PUT carrying X-Forwarded-For is refused, so a request relayed
// from inside an instance cannot get one. An address no instance holds gets 404; requests and
// answers are bounded; nothing is cached (user data and tokens are fetched per request).

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "bettercompute/agent/v1/spec.pb.h"
#include "daemon/log.h"

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
  std::function<int64_t()> now;
};

class ImdsServer {
 public:
  static absl::StatusOr<std::unique_ptr<ImdsServer>> Start(ImdsOptions options, Logger* log);
  ~ImdsServer();
  uint16_t port() const { return port_; }

  static constexpr int64_t kMaxTokenTtl = 21600;
  static constexpr std::size_t kMaxTokens = 4096;
  static constexpr std::size_t kMaxHeaderBytes = 8 * 1024;
  static constexpr int kMaxConcurrent = 16;  // requests served at once; more are closed

  // The answer, as sent, to one request given as its bytes from `peer` ("" when the bytes are
  // not one whole bounded request). The fuzz target drives the request handling through it.
  std::string AnswerBytes(std::string_view bytes, const std::string& peer);

 private:
  ImdsServer(ImdsOptions options, Logger* log) : options_(std::move(options)), log_(log) {}
  void Loop();
  struct Parsed;  // a parsed request (Beast stays in imds.cc)
  void Serve(int fd, const std::string& peer);
  // The serialized answer; `hop_limit_one` is set when it must leave with IP TTL 1.
  std::string Respond(const Parsed& request, const std::string& peer, bool* hop_limit_one);

  struct Token {
    std::string address;
    int64_t expires;
  };
  ImdsOptions options_;
  Logger* log_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::map<std::string, Token> tokens_;  // guarded by mu_
  int serving_ = 0;                      // guarded by mu_: requests in hand
  std::condition_variable idle_;         // serving_ fell
  std::thread thread_;
};

}  // namespace bcd
