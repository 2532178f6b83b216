// Offers arbitrary bytes as a SignedSpec to DesiredState (no command-signing roots, so every
// decodable spec reaches the section appliers, the access section's own check among them), and
// checks them as a JWKS.

#include <cstdint>
#include <filesystem>
#include <sstream>
#include <string_view>

#include "base/files.h"
#include "daemon/dispatch/desired.h"
#include "daemon/tunnels/tunnels.h"
#include "pki/envelope.h"
#include "pki/jwt.h"
#include "proto/signing_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::ostringstream sink;
  static bcd::Logger log(&sink, bcd::LogLevel::kError);
  static const std::filesystem::path* dir = [] {
    std::string pattern = "/tmp/bcd-spec-fuzz-XXXXXX";
    return new std::filesystem::path(mkdtemp(pattern.data()));
  }();
  // A trust bundle without command-signing roots, signed by a JoinService key made here.
  static const bcd::pki::TrustState* trust = [] {
    bcd::pki::PrivateKey join = *bcd::pki::PrivateKey::Generate();
    bettercompute::agent::v1::TrustBundle bundle;
    bundle.set_trust_domain("fuzz.test");
    bundle.set_version(1);
    bettercompute::agent::v1::SignedTrustBundle signed_bundle;
    signed_bundle.set_body(bundle.SerializeAsString());
    *signed_bundle.mutable_signature() = *bcd::pki::Sign(
        bcd::proto::BodySigningInput(bcd::proto::Purpose::kTrustBundle, signed_bundle.body()), join,
        "join");
    return new bcd::pki::TrustState(
        *bcd::pki::TrustState::FromFirstBundle(signed_bundle, join.Public()));
  }();
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  (void)bcd::pki::CheckJwks(bytes);
  std::filesystem::remove(*dir / "spec.binpb");
  auto state = bcd::DesiredState::Open(*dir, "n-1", &log);
  if (!state.ok()) return 0;
  // The node's own access applier: the section checked whole (ops, max_tunnels, JWKS).
  (*state)->Register("access", [](const bettercompute::agent::v1::NodeSpec& spec) -> absl::Status {
    return bcd::TunnelAccess::FromSection(spec.access(), bcd::kMaxTunnels).status();
  });
  bettercompute::agent::v1::SignedSpec signed_spec;
  signed_spec.set_body(std::string(bytes));
  (void)(*state)->Offer(signed_spec, *trust, 0);
  (void)(*state)->sections();
  // The same bytes as a persisted spec file, read at start.
  (void)bcd::AtomicWriteFile(*dir / "spec.binpb", std::string(bytes), 0600);
  if (auto reopened = bcd::DesiredState::Open(*dir, "n-1", &log); reopened.ok())
    (*reopened)->Reapply();
  return 0;
}
