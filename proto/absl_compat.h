#pragma once

// Debian builds Abseil with its own string_view rather than an alias of std::string_view; these
// convert at the boundary.

#include <string_view>

#include "absl/strings/string_view.h"

namespace bcd {

inline std::string_view ToStd(absl::string_view text) { return {text.data(), text.size()}; }
inline absl::string_view ToAbsl(std::string_view text) { return {text.data(), text.size()}; }

}  // namespace bcd
