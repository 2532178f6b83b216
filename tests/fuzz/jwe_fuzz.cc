// Compact JWEs from arbitrary text. The first byte picks the mode:
//   even  the rest opened with a key made here: a refusal, never a plaintext (the input cannot
//         know the recipient's key, so it cannot have encrypted to it)
//   odd   edits (position, xor) to a valid JWE sealed to that key: whatever still opens gives the
//         original plaintext (AES-GCM authenticates the protected header and the ciphertext)
// Nothing may crash or leak.

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "pki/jwe.h"
#include "pki/keys.h"

namespace {

struct Fixture {
  bcd::pki::PrivateKey recipient = *bcd::pki::PrivateKey::Generate();
  std::string plaintext = "the secret value";
  std::string jwe = *bcd::pki::SealJwe(plaintext, recipient.Public(), bcd::pki::kSecretJweType,
                                       {{"ref", "r"}, {"rid", "1"}}, 1800000060);
  bcd::pki::JweExpectation expect{
      bcd::pki::kSecretJweType, {{"ref", "r"}, {"rid", "1"}}, 1800000000};
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Fixture* fixture = new Fixture;
  if (size == 0) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) == 0) {
    if (bcd::pki::OpenJwe(rest, fixture->recipient, fixture->expect).ok()) abort();
    return 0;
  }
  std::string jwe = fixture->jwe;
  for (std::size_t i = 0; i + 1 < rest.size(); i += 2) {
    jwe[static_cast<unsigned char>(rest[i]) * 13 % jwe.size()] ^= rest[i + 1];
  }
  auto opened = bcd::pki::OpenJwe(jwe, fixture->recipient, fixture->expect);
  if (opened.ok() && *opened != fixture->plaintext) abort();
  return 0;
}
