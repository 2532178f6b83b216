// Feeds arbitrary text to the parsers of /proc/cpuinfo, /proc/meminfo, os-release and nvidia-smi.

#include <cstdint>
#include <string_view>

#include "modes/common/inventory.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)bcd::ParseCpuInfo(text);
  (void)bcd::ParseMemTotalBytes(text);
  (void)bcd::ParseOsRelease(text);
  (void)bcd::ParseNvidiaSmi(text);
  return 0;
}
