#pragma once

// Whole-file reads and atomic writes: how every state file is read and replaced.

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace bcd {

// Writes `data` to `path` atomically: a temp file in the same directory with `mode`, fsync, rename,
// fsync of the directory. On any error the old file is untouched and the temp file removed.
absl::Status AtomicWriteFile(const std::filesystem::path& path, std::string_view data, mode_t mode);

// The file's content; NotFound when it does not exist, an error when larger than `max_bytes`.
absl::StatusOr<std::string> ReadWholeFile(const std::filesystem::path& path, std::size_t max_bytes);

// An error for the failed call that set errno: NotFound for ENOENT, Internal otherwise; the
// message is "<what> <path>: <strerror>".
absl::Status ErrnoStatus(std::string_view what, const std::filesystem::path& path);

// fsync(2) and fdatasync(2), counted: every sync bcd asks of the disk goes through these, and
// SyncCount() is how many there were since the process started (the bcd_fsyncs_total metric).
int SyncFile(int fd);
int SyncFileData(int fd);
uint64_t SyncCount();

}  // namespace bcd
