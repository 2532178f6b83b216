#include "daemon/delivery/record_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/files.h"
#include "fmt/format.h"
#include "pki/keys.h"
#include "proto/signing_input.h"

namespace bcd {
namespace {

std::string Check(std::string_view a, std::string_view b = {}) {
  return pki::Sha256(std::string(a) + std::string(b)).substr(0, 4);
}

std::string Frame(std::string_view record) {
  std::string length = proto::Uint32Be(static_cast<uint32_t>(record.size()));
  return length + Check(length) + Check(length, record) + std::string(record);
}

uint32_t ReadU32(std::string_view data, std::size_t at) {
  return (static_cast<uint32_t>(static_cast<unsigned char>(data[at])) << 24) |
         (static_cast<uint32_t>(static_cast<unsigned char>(data[at + 1])) << 16) |
         (static_cast<uint32_t>(static_cast<unsigned char>(data[at + 2])) << 8) |
         static_cast<uint32_t>(static_cast<unsigned char>(data[at + 3]));
}

absl::Status Errno(std::string_view what, const std::filesystem::path& path) {
  return absl::InternalError(fmt::format("{} {}: {}", what, path.string(), std::strerror(errno)));
}

absl::Status Damaged(const std::filesystem::path& path, std::string_view what, uint64_t at) {
  return absl::DataLossError(fmt::format("{}: {} at byte {}", path.string(), what, at));
}

bool AllZero(std::string_view bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](char c) { return c == 0; });
}

// The format before the magic: uint32_be(length) || check(record) || record. Read strictly: only
// a header cut short or a last record whose check fails is taken for a torn tail.
absl::StatusOr<RecordLog::Parsed> ParseLegacy(std::string_view bytes,
                                              const std::filesystem::path& path) {
  RecordLog::Parsed parsed;
  parsed.legacy = true;
  std::size_t at = 0;
  while (at < bytes.size()) {
    std::size_t left = bytes.size() - at;
    if (left < 8) break;
    uint32_t length = ReadU32(bytes, at);
    if (length > RecordLog::kMaxRecord || left < 8 + length) {
      return Damaged(path, "damaged record length (a log of the earlier format)", at);
    }
    std::string_view record = bytes.substr(at + 8, length);
    if (Check(record) != bytes.substr(at + 4, 4)) {
      if (left == 8 + length) break;
      return Damaged(path, "damaged record (a log of the earlier format)", at);
    }
    parsed.records.emplace_back(record);
    parsed.offsets.push_back(at);
    at += 8 + length;
  }
  parsed.kept = at;
  return parsed;
}

}  // namespace

absl::StatusOr<RecordLog::Parsed> RecordLog::Parse(std::string_view bytes,
                                                   const std::filesystem::path& path) {
  Parsed parsed;
  if (bytes.size() < kMagic.size()) {
    // Empty, or the magic cut short when the file was being created: nothing was ever written.
    if (kMagic.substr(0, bytes.size()) == bytes) return parsed;
    return Damaged(path, "not a bcd record log", 0);
  }
  if (bytes.substr(0, kMagic.size()) != kMagic) {
    // The earlier format had no magic; its first bytes are a record length under 4 MiB.
    if (bytes[0] == 0 && ReadU32(bytes, 0) <= kMaxRecord) return ParseLegacy(bytes, path);
    return Damaged(path, "not a bcd record log", 0);
  }
  std::size_t at = kMagic.size();
  while (at < bytes.size()) {
    std::string_view rest = bytes.substr(at);
    if (rest.size() < kHeaderBytes || AllZero(rest)) break;  // torn: a crash mid-append
    std::string_view length_bytes = rest.substr(0, 4);
    if (Check(length_bytes) != rest.substr(4, 4)) return Damaged(path, "damaged record header", at);
    uint32_t length = ReadU32(rest, 0);
    if (length > kMaxRecord) return Damaged(path, "damaged record header", at);
    if (rest.size() < kHeaderBytes + length) break;  // the record's bytes never all arrived
    std::string_view record = rest.substr(kHeaderBytes, length);
    if (Check(length_bytes, record) != rest.substr(8, 4)) {
      // Half on disk when the machine stopped, if it is the last; damage if anything follows.
      if (rest.size() == kHeaderBytes + length) break;
      return Damaged(path, "damaged record", at);
    }
    parsed.records.emplace_back(record);
    parsed.offsets.push_back(at);
    at += kHeaderBytes + length;
  }
  parsed.kept = at;
  return parsed;
}

std::string RecordLog::Serialize(const std::vector<std::string>& records,
                                 std::vector<uint64_t>* offsets) {
  std::string data(kMagic);
  for (const std::string& record : records) {
    if (offsets != nullptr) offsets->push_back(data.size());
    data += Frame(record);
  }
  return data;
}

absl::StatusOr<RecordLog> RecordLog::Open(const std::filesystem::path& path,
                                          std::vector<std::string>* records,
                                          std::vector<uint64_t>* offsets) {
  absl::StatusOr<std::string> data = ReadWholeFile(path, 1u << 30);
  if (!data.ok() && !absl::IsNotFound(data.status())) return data.status();
  absl::StatusOr<Parsed> parsed = Parse(data.ok() ? *data : "", path);
  if (!parsed.ok()) return parsed.status();
  if (parsed->legacy || parsed->kept < kMagic.size()) {
    // New, or of the earlier format: written whole (atomically) in this one, then opened.
    std::vector<uint64_t> rewritten;
    if (absl::Status s = AtomicWriteFile(path, Serialize(parsed->records, &rewritten), 0600);
        !s.ok()) {
      return s;
    }
    parsed->offsets = std::move(rewritten);
    parsed->kept = Serialize(parsed->records).size();
  }
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", path);
  if (ftruncate(fd, static_cast<off_t>(parsed->kept)) != 0 || lseek(fd, 0, SEEK_END) < 0) {
    close(fd);
    return Errno("cannot cut the torn tail of", path);
  }
  for (std::string& record : parsed->records) records->push_back(std::move(record));
  if (offsets != nullptr) *offsets = std::move(parsed->offsets);
  return RecordLog(path, fd, parsed->kept);
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
  if (SyncFileData(fd_) != 0) return Errno("cannot sync", path_);
  bytes_ += framed.size();
  return absl::OkStatus();
}

absl::Status RecordLog::Rewrite(const std::vector<std::string>& records,
                                std::vector<uint64_t>* offsets) {
  std::string data = Serialize(records, offsets);
  if (absl::Status s = AtomicWriteFile(path_, data, 0600); !s.ok()) return s;
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
  std::string header(kHeaderBytes, '\0');
  if (offset < kMagic.size() || offset + kHeaderBytes > bytes_ ||
      !read_exactly(header.data(), kHeaderBytes, offset)) {
    return Damaged(path_, "no record", offset);
  }
  std::string_view length_bytes = std::string_view(header).substr(0, 4);
  uint32_t length = ReadU32(header, 0);
  if (Check(length_bytes) != header.substr(4, 4) || length > kMaxRecord ||
      offset + kHeaderBytes + length > bytes_) {
    return Damaged(path_, "damaged record header", offset);
  }
  std::string record(length, '\0');
  if (!read_exactly(record.data(), length, offset + kHeaderBytes) ||
      Check(length_bytes, record) != header.substr(8, 4)) {
    return Damaged(path_, "damaged record", offset);
  }
  return record;
}

}  // namespace bcd
