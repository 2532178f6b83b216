#pragma once

// The site agent's boot server ([boot] listen; HTTP, since iPXE in NIC ROMs speaks no HTTPS):
//
//   GET  /boot.ipxe                 the script DHCP's boot file names: chains the per-MAC script
//   GET  /boot/<MAC>.ipxe           the MAC's script (MAC as aa-bb-.. or aa:bb:..): its kernel with
//                                   the entry's command line and what the ramdisk needs (bcd.boot,
//                                   bcd.gateway, bcd.mac, bcd.entry, bcd.token), its initrd, boot.
//                                   A MAC without a live entry gets a script that says so and
//                                   asks again every kRetrySeconds, kMaxTries times, then exits
//                                   to the next boot device; an entry whose token was used says
//                                   so and exits at once.
//   GET  /boot/<MAC>/kernel|initrd  from the cache when the entry pins a sha256 (the file's hash
//                                   is checked before a byte is sent; Range and HEAD work), else
//                                   a redirect to the entry's URL
//   POST /discovery                 {"token", "mac", "nonce"} -> a SignedDiscoveryAssertion,
//                                   serialized and base64url-encoded, signed by the node key
//                                   (purpose "discovery") with its chain, valid kAssertionSeconds.
//                                   A token that is unknown, for another MAC, used or expired is
//                                   refused (403 naming which) and the refusal reported.
//
// Bounded like the other listeners: kMaxConnections at once (more get 503), kMaxHeaderBytes of
// headers, kMaxBodyBytes of body, request_deadline for a request to arrive whole and as long
// without progress while an answer leaves. One request per connection. Every answer is an access
// log line (boot.served) naming the MAC and the entry.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "base/fd.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/mutex.h"
#include "bettercompute/common/v1/common.pb.h"
#include "config/values.h"
#include "modes/site/boot_entries.h"

namespace bcd {

struct BootServerOptions {
  ListenAddress listen;  // port 0: any free port (tests)
  std::string url;       // how booting machines reach it: "http://10.20.0.5:8080"
  std::string gateway;   // the gateway's URL, for the ramdisk's command line ("" leaves it off)
  std::string site;      // the site assertions name
  BootEntries* entries = nullptr;
  std::filesystem::path cache_dir;  // files by their sha256 in hex
  // Signs a signing input with the node key and its chain.
  std::function<absl::StatusOr<bettercompute::common::v1::Signature>(std::string_view)> sign;
  // A refused discovery: reported as an event (the MAC as asked, the entry when there is one).
  std::function<void(const std::string& mac, const std::string& entry, std::string_view reason,
                     const std::string& peer)>
      refused;
  UnixClock now;
  std::function<std::string()> nonce;  // 16 random bytes (tests fix it)
  std::chrono::milliseconds request_deadline = std::chrono::seconds(10);
  Metrics* metrics = nullptr;
};

class BootServer {
 public:
  static constexpr int kMaxConnections = 64;
  static constexpr std::size_t kMaxHeaderBytes = 8 * 1024;
  static constexpr std::size_t kMaxBodyBytes = 4 * 1024;
  static constexpr int kRetrySeconds = 10;
  static constexpr int kMaxTries = 30;
  static constexpr int64_t kAssertionSeconds = 600;

  static absl::StatusOr<std::unique_ptr<BootServer>> Start(BootServerOptions options, Logger* log);
  ~BootServer();
  uint16_t port() const { return port_; }

  // The answer's head and in-memory body to one request given as its bytes from `peer` (""
  // while they are not yet a whole request); a file answer's bytes are left out. The fuzz target
  // drives the request handling through it.
  std::string AnswerBytes(std::string_view bytes, const std::string& peer);

  struct Reply;  // an answer: head, body, and a file range to send after them

 private:
  BootServer(BootServerOptions options, Logger* log);
  void Loop();
  void Serve(int fd, const std::string& peer);
  Reply Respond(std::string_view bytes, const std::string& peer, bool* whole);
  Reply Script(const std::string& mac, int tries, bool head);
  Reply File(const std::string& mac, std::string_view which, std::string_view range, bool head);
  Reply Discovery(std::string_view body, const std::string& peer);
  // The cache file of `sha256` opened and checked against it (a check remembered while the file
  // stays the same inode, size and mtime); none and a log line when it is missing or differs.
  Fd OpenVerified(const std::string& sha256);

  BootServerOptions options_;
  Logger* log_;
  CounterFamily* requests_ = nullptr;
  Counter bytes_;  // file and body bytes sent
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: stop
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  Mutex mu_;
  CondVar idle_;                             // a request ended
  std::set<int> open_ ABSL_GUARDED_BY(mu_);  // the sockets of requests being served
  struct Checked {
    uint64_t inode, size;
    int64_t mtime_ns;
  };
  std::map<std::string, Checked> checked_ ABSL_GUARDED_BY(mu_);  // by sha256
  std::thread thread_;
};

}  // namespace bcd
