// Opens arbitrary text as a compact JWE: a refusal or a plaintext, never a crash.

#include <cstdint>
#include <string_view>

#include "pki/jwe.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bcd::pki::PrivateKey* recipient =
      new bcd::pki::PrivateKey(*bcd::pki::PrivateKey::Generate());
  std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)bcd::pki::OpenJwe(text, *recipient,
                          {bcd::pki::kSecretJweType, {{"ref", "r"}, {"rid", "1"}}, 0});
  return 0;
}
