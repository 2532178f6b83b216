#include "app/notify.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cstring>

namespace bcd {

std::optional<SystemdNotifier> SystemdNotifier::FromEnvironment(
    const std::function<std::optional<std::string>(const char*)>& env) {
  std::optional<std::string> socket = env("NOTIFY_SOCKET");
  if (!socket || socket->empty() || socket->size() >= sizeof(sockaddr_un::sun_path) ||
      ((*socket)[0] != '/' && (*socket)[0] != '@')) {
    return std::nullopt;
  }
  SystemdNotifier notifier;
  notifier.socket_ = *socket;
  std::optional<std::string> usec = env("WATCHDOG_USEC");
  std::optional<std::string> pid = env("WATCHDOG_PID");
  uint64_t value = 0;
  if (usec && std::from_chars(usec->data(), usec->data() + usec->size(), value).ec == std::errc() &&
      value > 0 && (!pid || *pid == std::to_string(getpid()))) {
    notifier.watchdog_ = std::chrono::microseconds(value / 2);
  }
  return notifier;
}

bool SystemdNotifier::Notify(std::string_view state) const {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, socket_.data(), socket_.size());
  if (address.sun_path[0] == '@') address.sun_path[0] = '\0';  // abstract namespace
  socklen_t length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + socket_.size());
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  bool sent =
      sendto(fd, state.data(), state.size(), MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&address),
             length) == static_cast<ssize_t>(state.size());
  close(fd);
  return sent;
}

bool IsJournalStream(int fd, const std::function<std::optional<std::string>(const char*)>& env) {
  std::optional<std::string> stream = env("JOURNAL_STREAM");
  if (!stream) return false;
  struct stat st {};
  if (fstat(fd, &st) != 0) return false;
  unsigned long long device = 0, inode = 0;
  char tail = 0;
  if (std::sscanf(stream->c_str(), "%llu:%llu%c", &device, &inode, &tail) != 2) return false;
  return device == static_cast<unsigned long long>(st.st_dev) &&
         inode == static_cast<unsigned long long>(st.st_ino);
}

}  // namespace bcd
