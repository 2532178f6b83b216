#pragma once

// Shared by the JWE and JWS code: bounded JSON parsing of untrusted JOSE headers and claims.

#include <optional>
#include <string_view>

#include "nlohmann/json.hpp"

namespace bcd::pki {

// The JSON object `text` holds (at most `max_bytes` and 16 levels deep), else nullopt.
std::optional<nlohmann::json> ParseJsonObject(std::string_view text, std::size_t max_bytes);

// The member `name` of `object` when it is a string; never throws, whatever the JSON holds.
std::optional<std::string> StringMember(const nlohmann::json& object, std::string_view name);

// Splits a compact serialization at '.'.
std::vector<std::string_view> SplitCompact(std::string_view compact);

}  // namespace bcd::pki
