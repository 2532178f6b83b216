#include "daemon/record_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "fmt/format.h"
#include "pki/files.h"
#include "pki/keys.h"
#include "proto/signing_input.h"

namespace bcd {
namespace {

std::string Frame(std::string_view record) {
  return proto::Uint32Be(static_cast<uint32_t>(record.size())) + pki::Sha256(record).substr(0, 4) +
         std::string(record);
}

uint32_t ReadU32(const std::string& data, std::size_t at) {
  return (static_cast<uint32_t>(static_cast<unsigned char>(data[at])) << 24) |
         (static_cast<uint32_t>(static_cast<unsigned char>(data[at + 1])) << 16) |
         (static_cast<uint32_t>(static_cast<unsigned char>(data[at + 2])) << 8) |
         static_cast<uint32_t>(static_cast<unsigned char>(data[at + 3]));
}

absl::Status Errno(std::string_view what, const std::filesystem::path& path) {
  return absl::InternalError(fmt::format("{} {}: {}", what, path.string(), std::strerror(errno)));
}

}  // namespace

absl::StatusOr<RecordLog> RecordLog::Open(const std::filesystem::path& path,
                                          std::vector<std::string>* records,
                                          std::vector<uint64_t>* offsets) {
  absl::StatusOr<std::string> data = pki::ReadWholeFile(path, 1u << 30);
  if (!data.ok() && !absl::IsNotFound(data.status())) return data.status();
  std::string bytes = data.ok() ? *data : "";
  std::size_t at = 0;
  while (at < bytes.size()) {
    std::size_t left = bytes.size() - at;
    if (left < 8) break;  // a torn header: the crash came mid-append
    uint32_t length = ReadU32(bytes, at);
    if (length > kMaxRecord) {
      return absl::DataLossError(
          fmt::format("{}: damaged record length at byte {}", path.string(), at));
    }
    if (left < 8 + length) break;  // a torn record
    std::string record = bytes.substr(at + 8, length);
    if (pki::Sha256(record).substr(0, 4) != bytes.substr(at + 4, 4)) {
      if (left == 8 + length) break;  // the last record, half on disk when the machine stopped
      return absl::DataLossError(fmt::format("{}: damaged record at byte {}", path.string(), at));
    }
    records->push_back(std::move(record));
    if (offsets != nullptr) offsets->push_back(at);
    at += 8 + length;
  }
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("cannot open", path);
  if (ftruncate(fd, static_cast<off_t>(at)) != 0 || lseek(fd, 0, SEEK_END) < 0) {
    close(fd);
    return Errno("cannot cut the torn tail of", path);
  }
  return RecordLog(path, fd, at);
}

RecordLog::RecordLog(RecordLog&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), bytes_(other.bytes_) {}

RecordLog& RecordLog::operator=(RecordLog&& other) noexcept {
  if (fd_ >= 0) close(fd_);
  path_ = std::move(other.path_);
  fd_ = std::exchange(other.fd_, -1);
  bytes_ = other.bytes_;
  return *this;
}

RecordLog::~RecordLog() {
  if (fd_ >= 0) close(fd_);
}

absl::Status RecordLog::Append(std::string_view record) {
  if (record.size() > kMaxRecord) return absl::InvalidArgumentError("record too large");
  std::string framed = Frame(record);
  for (std::size_t written = 0; written < framed.size();) {
    ssize_t n = write(fd_, framed.data() + written, framed.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      absl::Status status = Errno("cannot append to", path_);
      // Cut a partial record so the next append starts on a boundary.
      if (ftruncate(fd_, static_cast<off_t>(bytes_)) == 0) lseek(fd_, 0, SEEK_END);
      return status;
    }
    written += static_cast<std::size_t>(n);
  }
  if (fdatasync(fd_) != 0) return Errno("cannot sync", path_);
  bytes_ += framed.size();
  return absl::OkStatus();
}

absl::Status RecordLog::Rewrite(const std::vector<std::string>& records,
                                std::vector<uint64_t>* offsets) {
  std::string data;
  for (const std::string& record : records) {
    if (offsets != nullptr) offsets->push_back(data.size());
    data += Frame(record);
  }
  if (absl::Status s = pki::AtomicWriteFile(path_, data, 0600); !s.ok()) return s;
  int fd = open(path_.c_str(), O_RDWR | O_APPEND | O_CLOEXEC);
  if (fd < 0) return Errno("cannot reopen", path_);
  close(fd_);
  fd_ = fd;
  bytes_ = data.size();
  return absl::OkStatus();
}

absl::StatusOr<std::string> RecordLog::Read(uint64_t offset) const {
  auto read_exactly = [&](char* into, std::size_t size, uint64_t at) {
    for (std::size_t done = 0; done < size;) {
      ssize_t n = pread(fd_, into + done, size - done, static_cast<off_t>(at + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      done += static_cast<std::size_t>(n);
    }
    return true;
  };
  std::string header(8, '\0');
  if (offset + 8 > bytes_ || !read_exactly(header.data(), 8, offset)) {
    return absl::DataLossError(fmt::format("{}: no record at byte {}", path_.string(), offset));
  }
  uint32_t length = ReadU32(header, 0);
  if (length > kMaxRecord || offset + 8 + length > bytes_) {
    return absl::DataLossError(
        fmt::format("{}: damaged record length at byte {}", path_.string(), offset));
  }
  std::string record(length, '\0');
  if (!read_exactly(record.data(), length, offset + 8) ||
      pki::Sha256(record).substr(0, 4) != header.substr(4, 4)) {
    return absl::DataLossError(
        fmt::format("{}: damaged record at byte {}", path_.string(), offset));
  }
  return record;
}

}  // namespace bcd
