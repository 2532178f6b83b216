#include "base/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "base/fd.h"
#include "fmt/format.h"

namespace bcd {

namespace {
std::atomic<uint64_t> syncs{0};
}  // namespace

int SyncFile(int fd) {
  syncs.fetch_add(1, std::memory_order_relaxed);
  return fsync(fd);
}

int SyncFileData(int fd) {
  syncs.fetch_add(1, std::memory_order_relaxed);
  return fdatasync(fd);
}

uint64_t SyncCount() { return syncs.load(std::memory_order_relaxed); }

absl::Status ErrnoStatus(std::string_view what, const std::filesystem::path& path) {
  int error = errno;
  std::string message = fmt::format("{} {}: {}", what, path.string(), std::strerror(error));
  return error == ENOENT ? absl::NotFoundError(message) : absl::InternalError(message);
}

absl::Status AtomicWriteFile(const std::filesystem::path& path, std::string_view data,
                             mode_t mode) {
  std::filesystem::path dir = path.parent_path().empty() ? "." : path.parent_path();
  std::string temp = (dir / ("." + path.filename().string() + ".XXXXXX")).string();
  Fd fd(mkstemp(temp.data()));
  if (!fd) return ErrnoStatus("cannot create a temp file beside", path);
  auto fail = [&](std::string_view what) {
    absl::Status status = ErrnoStatus(what, temp);
    fd.reset();
    unlink(temp.c_str());
    return status;
  };
  if (fchmod(fd.get(), mode) != 0) return fail("cannot set the mode of");
  for (std::size_t written = 0; written < data.size();) {
    ssize_t n = write(fd.get(), data.data() + written, data.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("cannot write");
    written += static_cast<std::size_t>(n);
  }
  if (SyncFile(fd.get()) != 0) return fail("cannot sync");
  if (!fd.Close()) {
    absl::Status status = ErrnoStatus("cannot close", temp);
    unlink(temp.c_str());
    return status;
  }
  if (rename(temp.c_str(), path.c_str()) != 0) {
    absl::Status status = ErrnoStatus("cannot rename into place", path);
    unlink(temp.c_str());
    return status;
  }
  Fd dir_fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir_fd) return ErrnoStatus("cannot open the directory of", path);
  if (SyncFile(dir_fd.get()) != 0) return ErrnoStatus("cannot sync the directory of", path);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadWholeFile(const std::filesystem::path& path,
                                          std::size_t max_bytes) {
  Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return ErrnoStatus("cannot open", path);
  std::string out;
  char buffer[8192];
  while (true) {
    ssize_t n = read(fd.get(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("cannot read", path);
    if (n == 0) break;
    if (out.size() + static_cast<std::size_t>(n) > max_bytes) {
      return absl::InvalidArgumentError(
          fmt::format("{} is larger than {} bytes", path.string(), max_bytes));
    }
    out.append(buffer, static_cast<std::size_t>(n));
  }
  return out;
}

}  // namespace bcd
