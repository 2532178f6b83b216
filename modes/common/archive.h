#pragma once

// A .tar.gz written as it goes: ustar headers (POSIX.1-1988, read by GNU tar, bsdtar and Python's
// tarfile), gzip through zlib, the SHA-256 and size of the compressed bytes computed while writing.
// For log bundles: regular files only, names up to 100 bytes.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace bcd {

class TarGzWriter {
 public:
  struct Summary {
    uint64_t size_bytes = 0;  // of the .tar.gz
    std::string sha256;       // raw 32 bytes, of the .tar.gz
  };

  // Creates a new file (0600) of a fresh name in `dir` ("<prefix>XXXXXX.tar.gz", mkstemp-style:
  // never one that exists, never through a name a command chose). The caller removes it.
  static absl::StatusOr<std::unique_ptr<TarGzWriter>> Create(const std::filesystem::path& dir,
                                                             std::string_view prefix);
  ~TarGzWriter();
  const std::filesystem::path& path() const;

  // Adds a regular file (mode 0644) with these contents and modification time (unix seconds).
  absl::Status Add(std::string_view name, std::string_view contents, int64_t mtime);
  // Writes the end-of-archive blocks and the gzip trailer, and closes the file.
  absl::StatusOr<Summary> Finish();

 private:
  struct State;
  explicit TarGzWriter(std::unique_ptr<State> state);
  absl::Status Write(std::string_view bytes, bool finish);
  std::unique_ptr<State> state_;
};

}  // namespace bcd
