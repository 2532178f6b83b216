#pragma once

// Signatures over agent/v1 signing inputs (proto/signing_input.h builds the input for each
// purpose). A verifier never re-encodes: it verifies the exact bytes it was given.

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "bettercompute/common/v1/common.pb.h"
#include "pki/keys.h"
#include "pki/x509.h"

namespace bcd::pki {

// Signs `signing_input` with `key` (raw, low-S) and names it `kid`, carrying `chain_der` (leaf
// first) when the verifier needs a chain.
absl::StatusOr<bettercompute::common::v1::Signature> Sign(
    std::string_view signing_input, const PrivateKey& key, std::string_view kid,
    const std::vector<std::string>& chain_der = {});

// OK when `signature` verifies over `signing_input` with the pinned `key`.
absl::Status VerifyWithKey(std::string_view signing_input,
                           const bettercompute::common::v1::Signature& signature,
                           const PublicKey& key);

// OK when the signature's chain (leaf first) leads to one of `anchors` at `now` and the leaf's key
// verifies the signature over `signing_input`.
absl::Status VerifyWithChain(std::string_view signing_input,
                             const bettercompute::common::v1::Signature& signature,
                             const std::vector<Certificate>& anchors, int64_t now);

}  // namespace bcd::pki
