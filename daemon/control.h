#pragma once

// The local control socket (<state_dir>/bcd.sock, 0600): each connection gets the daemon's status
// as "key: value" lines and is closed. `bcd status` reads it, or falls back to the state dir.

#include <filesystem>
#include <functional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace bcd {

class ControlServer {
 public:
  // Serves `render()` to every connection, from its own thread, until destroyed.
  static absl::StatusOr<std::unique_ptr<ControlServer>> Start(const std::filesystem::path& path,
                                                              std::function<std::string()> render);
  ~ControlServer();

 private:
  ControlServer() = default;
  void Loop();
  std::filesystem::path path_;
  std::function<std::string()> render_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;  // eventfd that wakes the loop to stop
  std::thread thread_;
};

// What the daemon at `path` says, or Unavailable when none answers.
absl::StatusOr<std::string> QueryControl(const std::filesystem::path& path);

}  // namespace bcd
