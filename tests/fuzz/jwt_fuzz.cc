// Tunnel tickets and JWKS from arbitrary text. The first byte picks the mode:
//   even  the rest is a ticket, checked against the JWKS of a key made here (which the input
//         cannot know): it must never verify; and the rest as a JWKS for a fixed ticket
//   odd   edits (position, xor) to a valid ticket signed by that key: whatever still verifies
//         has the signed part (header and claims) of the original
// Nothing may crash or leak.

#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "pki/jwt.h"
#include "pki/keys.h"

namespace {

struct Fixture {
  bcd::pki::PrivateKey key = *bcd::pki::PrivateKey::Generate();
  std::string jwks = bcd::pki::JwksOf(key.Public(), "t1");
  std::string ticket = *bcd::pki::SignJwt(
      R"({"aud":"node:n-1","jti":"j-1","iat":1800000000,"exp":1800000060,"sid":"sess-1","tid":"tun-1","op":"exec","cmd":["true"]})",
      key, "t1");
  bcd::pki::TicketExpectation expect{"n-1", "sess-1", "tun-1", 1800000010};
};

std::string SignedPart(std::string_view ticket) {
  return std::string(ticket.substr(0, ticket.rfind('.')));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Fixture* fixture = new Fixture;
  if (size == 0) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) == 0) {
    if (bcd::pki::TunnelTicket::Verify(rest, fixture->jwks, fixture->expect).ok()) abort();
    (void)bcd::pki::TunnelTicket::Verify("eyJhbGciOiJFUzI1NiIsImtpZCI6InQxIn0.e30.AA", rest,
                                         fixture->expect);
    (void)bcd::pki::CheckJwks(rest);
    return 0;
  }
  std::string ticket = fixture->ticket;
  for (std::size_t i = 0; i + 1 < rest.size(); i += 2) {
    ticket[static_cast<unsigned char>(rest[i]) * 7 % ticket.size()] ^= rest[i + 1];
  }
  if (bcd::pki::TunnelTicket::Verify(ticket, fixture->jwks, fixture->expect).ok() &&
      SignedPart(ticket) != SignedPart(fixture->ticket)) {
    abort();  // a header or claims nobody signed were taken
  }
  return 0;
}
