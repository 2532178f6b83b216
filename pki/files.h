#pragma once

// Whole-file reads and atomic writes for the files pki is handed (keys, jti set).

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace bcd::pki {

// Writes `data` to `path` atomically: a temp file in the same directory with `mode`, fsync, rename,
// fsync of the directory. On any error the old file is untouched and the temp file removed.
absl::Status AtomicWriteFile(const std::filesystem::path& path, std::string_view data, mode_t mode);

// The file's content; NotFound when it does not exist, an error when larger than `max_bytes`.
absl::StatusOr<std::string> ReadWholeFile(const std::filesystem::path& path, std::size_t max_bytes);

class PrivateKey;

// Writes the key as PKCS#8 PEM, atomically, mode 0600.
absl::Status StorePrivateKey(const std::filesystem::path& path, const PrivateKey& key);
// Reads a PEM key file; refuses one that group or others may read or write.
absl::StatusOr<PrivateKey> LoadPrivateKey(const std::filesystem::path& path);

}  // namespace bcd::pki
