#pragma once

// base64url without padding (RFC 4648 §5, as JOSE uses it). Decoding is strict: no padding, no
// whitespace, no characters outside the URL-safe alphabet, and no non-zero trailing bits.

#include <optional>
#include <string>
#include <string_view>

namespace bcd::pki {

std::string Base64UrlEncode(std::string_view bytes);
std::optional<std::string> Base64UrlDecode(std::string_view text);

}  // namespace bcd::pki
