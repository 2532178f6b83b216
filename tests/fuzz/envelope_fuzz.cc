// Feeds arbitrary bytes to the envelope and trust-bundle code: as a SignedTrustBundle (first and
// later), as a signature and as public keys. Nothing the input holds is ever taken as signed by
// the JoinService key made here.

#include <cstdint>
#include <string>

#include "pki/envelope.h"
#include "pki/trust.h"
#include "proto/frame_codec.h"
#include "proto/signing_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bcd::pki::PrivateKey* join =
      new bcd::pki::PrivateKey(*bcd::pki::PrivateKey::Generate());
  std::string bytes(reinterpret_cast<const char*>(data), size);
  bettercompute::agent::v1::SignedTrustBundle signed_bundle;
  if (bcd::proto::DecodeMessage(bytes, &signed_bundle).ok()) {
    // Nothing the input holds was signed by the key made here: no bundle of it is taken.
    if (bcd::pki::TrustState::FromFirstBundle(signed_bundle, join->Public()).ok()) abort();
    // A correctly signed copy of the body, so the bundle parser itself is reached.
    bettercompute::agent::v1::SignedTrustBundle resigned;
    resigned.set_body(signed_bundle.body());
    std::string input =
        bcd::proto::BodySigningInput(bcd::proto::Purpose::kTrustBundle, resigned.body());
    *resigned.mutable_signature() = *bcd::pki::Sign(input, *join, "join");
    if (auto state = bcd::pki::TrustState::FromFirstBundle(resigned, join->Public()); state.ok()) {
      (void)state->Accept(resigned, join->Public());
    }
  }
  bettercompute::common::v1::Signature signature;
  signature.set_sig(bytes);
  if (bcd::pki::VerifyWithKey("input", signature, join->Public()).ok()) abort();
  (void)bcd::pki::Es256DerToRaw(bytes);
  (void)bcd::pki::PublicKey::FromSpkiDer(bytes);
  (void)bcd::pki::PublicKey::FromSec1(bytes);
  return 0;
}
