// Verifies arbitrary text as a tunnel ticket, and parses it as a JWKS.

#include <cstdint>
#include <string_view>

#include "pki/jwt.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string* jwks =
      new std::string(bcd::pki::JwksOf(bcd::pki::PrivateKey::Generate()->Public(), "t1"));
  std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)bcd::pki::TunnelTicket::Verify(text, *jwks, {"n-1", "sess-1", "tun-1", 1800000000});
  // The same bytes as the JWKS, with a fixed ticket.
  (void)bcd::pki::TunnelTicket::Verify("eyJhbGciOiJFUzI1NiIsImtpZCI6InQxIn0.e30.AA", text,
                                       {"n-1", "sess-1", "tun-1", 1800000000});
  return 0;
}
