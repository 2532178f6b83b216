#pragma once

// Compact JWE with alg ECDH-ES+A256KW and enc A256GCM (RFC 7516, RFC 7518 §4.6), as the secret
// broker and the workload-token service answer: encrypted to a one-use P-256 key, with typ and
// binding members in the protected header. Any other alg or enc is refused.

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "pki/keys.h"

namespace bcd::pki {

inline constexpr std::string_view kSecretJweType = "bcsecret+jwe";      // binds ref, rid
inline constexpr std::string_view kWorkloadJweType = "bcworkload+jwe";  // binds iid, rid
inline constexpr std::size_t kMaxJweBytes = 1 << 20;

struct JweExpectation {
  std::string_view typ;
  // Header members that must be strings equal to these values: {"ref", ...}, {"rid", ...}.
  std::vector<std::pair<std::string_view, std::string_view>> bindings;
  int64_t now;  // unix seconds; exp must be after it
};

// The plaintext of `compact`, decrypted with `recipient`, once every check passes. Errors name the
// check that failed.
absl::StatusOr<std::string> OpenJwe(std::string_view compact, const PrivateKey& recipient,
                                    const JweExpectation& expect);

// Encrypts `plaintext` to `recipient` with a fresh ephemeral key; the header carries `typ`, the
// bindings and `exp`. For the dev gateway and tests.
absl::StatusOr<std::string> SealJwe(
    std::string_view plaintext, const PublicKey& recipient, std::string_view typ,
    const std::vector<std::pair<std::string_view, std::string_view>>& bindings, int64_t exp);

}  // namespace bcd::pki
