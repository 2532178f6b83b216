#pragma once

// An append-only file of records, each framed as uint32_be(length) || 4 bytes of SHA-256(record) ||
// record, and fsynced before Append returns. Opening it keeps every whole record; a torn last
// record (a crash mid-append, never reported as written) is cut off, while damage before the end is
// DataLoss naming the file and offset: it is never silently dropped.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace bcd {

class RecordLog {
 public:
  static constexpr std::size_t kMaxRecord = 4u << 20;

  // Opens (creating, 0600) the log and returns it with the records it holds, and where each
  // starts when `offsets` is given.
  static absl::StatusOr<RecordLog> Open(const std::filesystem::path& path,
                                        std::vector<std::string>* records,
                                        std::vector<uint64_t>* offsets = nullptr);
  RecordLog(RecordLog&& other) noexcept;
  RecordLog& operator=(RecordLog&& other) noexcept;
  ~RecordLog();

  absl::Status Append(std::string_view record);
  // Replaces the whole log with `records`, atomically; `offsets` gets where each now starts.
  absl::Status Rewrite(const std::vector<std::string>& records,
                       std::vector<uint64_t>* offsets = nullptr);
  // The record that starts at `offset` (an offset from Open, Rewrite or bytes() before an
  // Append), checked against its checksum. Thread-safe against nothing else running on the log.
  absl::StatusOr<std::string> Read(uint64_t offset) const;
  uint64_t bytes() const { return bytes_; }

 private:
  RecordLog(std::filesystem::path path, int fd, uint64_t bytes)
      : path_(std::move(path)), fd_(fd), bytes_(bytes) {}
  std::filesystem::path path_;
  int fd_ = -1;
  uint64_t bytes_ = 0;
};

}  // namespace bcd
