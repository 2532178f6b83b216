#pragma once

// The version this binary says it is. It lives in the ELF section .bcd_version (64 bytes, NUL
// padded), so a built binary can be stamped with another version after the link:
//
//   objcopy --update-section .bcd_version=FILE bcd bcd-0.2.0
//
// where FILE holds the version padded with NULs to 64 bytes (scripts/stamp-version does it). The
// build's own version comes from CMake (-DBCD_VERSION=..., the project version by default).

#include <string>
#include <string_view>

namespace bcd {

inline constexpr std::size_t kVersionStampBytes = 64;

// "0.1.0": read from the section at run time, never folded in by the compiler.
std::string_view Version();

}  // namespace bcd
