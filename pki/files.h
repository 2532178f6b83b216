#pragma once

// Private key files: written atomically with mode 0600, refused when others may read them.

#include <filesystem>

#include "absl/status/statusor.h"

namespace bcd::pki {

class PrivateKey;

// Writes the key as PKCS#8 PEM, atomically, mode 0600.
absl::Status StorePrivateKey(const std::filesystem::path& path, const PrivateKey& key);
// Reads a PEM key file; refuses one that group or others may read or write.
absl::StatusOr<PrivateKey> LoadPrivateKey(const std::filesystem::path& path);

}  // namespace bcd::pki
