#pragma once

// A file descriptor with one owner: closed when the owner goes, moved but never copied. Every fd
// bcd opens lives in one of these (or in a library's own owner: a socket in Asio, a pipe in
// posix_spawn's file actions) from the call that opened it.

#include <unistd.h>

#include <utility>

namespace bcd {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  explicit operator bool() const { return valid(); }
  // Gives the descriptor up without closing it.
  int release() { return std::exchange(fd_, -1); }
  // Closes what is held (if anything) and holds `fd`.
  void reset(int fd = -1) {
    int old = std::exchange(fd_, fd);
    if (old >= 0) ::close(old);
  }
  // Closes now and says whether close succeeded (it reports write-back errors on some files).
  bool Close() {
    int old = release();
    return old < 0 || ::close(old) == 0;
  }

 private:
  int fd_ = -1;
};

}  // namespace bcd
