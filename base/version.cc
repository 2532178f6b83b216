#include "base/version.h"

#include <cstring>

// Writable and referenced only through a volatile read, so no translation unit can fold the
// build's value in: what the section holds when the binary runs is the version.
extern "C" {
__attribute__((section(".bcd_version"), used)) char bcd_version_stamp[bcd::kVersionStampBytes] =
    BCD_VERSION_DEFAULT;
}

namespace bcd {

std::string_view Version() {
  static const std::string version = [] {
    std::string text;
    for (std::size_t i = 0; i < kVersionStampBytes; ++i) {
      char c = static_cast<const volatile char*>(bcd_version_stamp)[i];
      if (c == '\0') break;
      text += c;
    }
    return text;
  }();
  return version;
}

}  // namespace bcd
