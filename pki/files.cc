#include "pki/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "fmt/format.h"
#include "pki/keys.h"
#include "proto/absl_compat.h"

namespace bcd::pki {
namespace {

absl::Status Errno(std::string_view what, const std::filesystem::path& path) {
  int error = errno;
  std::string message = fmt::format("{} {}: {}", what, path.string(), std::strerror(error));
  return error == ENOENT ? absl::NotFoundError(message) : absl::InternalError(message);
}

}  // namespace

absl::Status AtomicWriteFile(const std::filesystem::path& path, std::string_view data,
                             mode_t mode) {
  std::filesystem::path dir = path.parent_path().empty() ? "." : path.parent_path();
  std::string temp = (dir / ("." + path.filename().string() + ".XXXXXX")).string();
  int fd = mkstemp(temp.data());
  if (fd < 0) return Errno("cannot create a temp file beside", path);
  auto fail = [&](std::string_view what) {
    absl::Status status = Errno(what, temp);
    close(fd);
    unlink(temp.c_str());
    return status;
  };
  if (fchmod(fd, mode) != 0) return fail("cannot set the mode of");
  for (std::size_t written = 0; written < data.size();) {
    ssize_t n = write(fd, data.data() + written, data.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("cannot write");
    written += static_cast<std::size_t>(n);
  }
  if (fsync(fd) != 0) return fail("cannot sync");
  if (close(fd) != 0) {
    absl::Status status = Errno("cannot close", temp);
    unlink(temp.c_str());
    return status;
  }
  if (rename(temp.c_str(), path.c_str()) != 0) {
    absl::Status status = Errno("cannot rename into place", path);
    unlink(temp.c_str());
    return status;
  }
  int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return Errno("cannot open the directory of", path);
  int synced = fsync(dir_fd);
  close(dir_fd);
  if (synced != 0) return Errno("cannot sync the directory of", path);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadWholeFile(const std::filesystem::path& path,
                                          std::size_t max_bytes) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", path);
  std::string out;
  char buffer[8192];
  while (true) {
    ssize_t n = read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      absl::Status status = Errno("cannot read", path);
      close(fd);
      return status;
    }
    if (n == 0) break;
    if (out.size() + static_cast<std::size_t>(n) > max_bytes) {
      close(fd);
      return absl::InvalidArgumentError(
          fmt::format("{} is larger than {} bytes", path.string(), max_bytes));
    }
    out.append(buffer, static_cast<std::size_t>(n));
  }
  close(fd);
  return out;
}

absl::Status StorePrivateKey(const std::filesystem::path& path, const PrivateKey& key) {
  return AtomicWriteFile(path, key.ToPem(), 0600);
}

absl::StatusOr<PrivateKey> LoadPrivateKey(const std::filesystem::path& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return Errno("cannot read the key file", path);
  if ((st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(
        fmt::format("key file {} has mode {:04o}: group and others must have no access (chmod 600)",
                    path.string(), st.st_mode & 07777));
  }
  absl::StatusOr<std::string> pem = ReadWholeFile(path, 64 * 1024);
  if (!pem.ok()) return pem.status();
  absl::StatusOr<PrivateKey> key = PrivateKey::FromPem(*pem);
  if (!key.ok()) {
    return absl::DataLossError(
        fmt::format("key file {}: {}", path.string(), ToStd(key.status().message())));
  }
  return key;
}

}  // namespace bcd::pki
