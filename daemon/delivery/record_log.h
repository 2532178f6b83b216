#pragma once

// An append-only file of records, fsynced before Append returns. The file starts with an 8-byte
// magic; each record is framed as
//
//   uint32_be(length) || check(length) || check(length || record) || record
//
// where check(x) is the first 4 bytes of SHA-256(x). Opening keeps every whole record. Only a
// partial last record is cut off, the mark of a crash mid-append that was never reported written:
// a header cut short, a header whose own check holds but whose record runs past the end, a last
// record whose bytes did not all reach the disk, or a tail of zeros. Anything else damaged (a
// header whose check fails, a record before the last whose check fails, a file of another format)
// is DataLoss naming the file and offset: never silently dropped or emptied.
//
// Logs written before the magic existed (bare uint32_be(length) || check(record) || record) are
// read once, strictly, and rewritten in this format.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace bcd {

class RecordLog {
 public:
  static constexpr std::size_t kMaxRecord = 4u << 20;
  static constexpr std::string_view kMagic{"bcdlog\0\2", 8};
  static constexpr std::size_t kHeaderBytes = 12;

  // Opens (creating, 0600) the log and returns it with the records it holds, and where each
  // starts when `offsets` is given.
  static absl::StatusOr<RecordLog> Open(const std::filesystem::path& path,
                                        std::vector<std::string>* records,
                                        std::vector<uint64_t>* offsets = nullptr);
  // What Open reads from `bytes` (the whole file): the records, where each starts, and how many
  // leading bytes hold them (the rest is the torn tail Open cuts); DataLoss naming `path` and the
  // offset of the damage otherwise. Pure: the fuzz target drives it.
  struct Parsed {
    std::vector<std::string> records;
    std::vector<uint64_t> offsets;
    uint64_t kept = 0;
    bool legacy = false;  // written in the format before the magic
  };
  static absl::StatusOr<Parsed> Parse(std::string_view bytes, const std::filesystem::path& path);
  // The bytes of a log holding `records`, as Rewrite writes it.
  static std::string Serialize(const std::vector<std::string>& records,
                               std::vector<uint64_t>* offsets = nullptr);

  RecordLog(RecordLog&& other) noexcept;
  RecordLog& operator=(RecordLog&& other) noexcept;
  ~RecordLog();

  absl::Status Append(std::string_view record);
  // Replaces the whole log with `records`, atomically; `offsets` gets where each now starts.
  absl::Status Rewrite(const std::vector<std::string>& records,
                       std::vector<uint64_t>* offsets = nullptr);
  // The record that starts at `offset` (an offset from Open, Rewrite or bytes() before an
  // Append), checked against its checksums. Thread-safe against nothing else running on the log.
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
