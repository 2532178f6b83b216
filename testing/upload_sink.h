#pragma once

// An HTTP/1.1 server on loopback that takes PUT requests the way an object store takes a presigned
// upload: it reads the headers and Content-Length bytes of body, keeps them, and answers with the
// status the test chose. Plain sockets, one request per connection, one thread.

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace bcd::testing {

class UploadSink {
 public:
  struct Request {
    std::string method, target;
    std::map<std::string, std::string> headers;  // names lowercased
    std::string body;
  };

  UploadSink();  // listens on 127.0.0.1, a free port
  ~UploadSink();
  int port() const { return port_; }
  std::string Url(const std::string& target) const {
    return "http://127.0.0.1:" + std::to_string(port_) + target;
  }
  void AnswerWith(int status) { status_ = status; }
  // Takes each request whole and then never answers (until the sink is destroyed): an upload that
  // hangs after its body.
  void Hang(bool hang) { hang_ = hang; }
  std::vector<Request> requests() const;

 private:
  void Loop();
  void Serve(int fd);
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<int> status_{200};
  std::atomic<bool> hang_{false};
  std::atomic<bool> stopping_{false};
  mutable std::mutex mu_;
  std::vector<Request> requests_;  // guarded by mu_
  std::thread thread_;
};

}  // namespace bcd::testing
