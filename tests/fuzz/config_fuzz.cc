// Parses arbitrary text as config.toml, as a URL and as a protocol range: an error or a value,
// never a crash.

#include <cstdint>
#include <string_view>

#include "config/config.h"
#include "proto/version.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)bcd::Config::Parse(text, "fuzz.toml");
  (void)bcd::Url::Parse(text, {"https", "wss"});
  (void)bcd::Sha256Pin::ParseHex(text);
  (void)bcd::proto::ProtocolRange::Parse(text);
  return 0;
}
