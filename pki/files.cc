#include "pki/files.h"

#include <sys/stat.h>

#include "base/files.h"
#include "fmt/format.h"
#include "pki/keys.h"
#include "proto/absl_compat.h"

namespace bcd::pki {

absl::Status StorePrivateKey(const std::filesystem::path& path, const PrivateKey& key) {
  return AtomicWriteFile(path, key.ToPem(), 0600);
}

absl::StatusOr<PrivateKey> LoadPrivateKey(const std::filesystem::path& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return ErrnoStatus("cannot read the key file", path);
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
