#include "pki/trust.h"

#include <algorithm>
#include <set>

#include "fmt/format.h"
#include "pki/envelope.h"
#include "proto/absl_compat.h"
#include "proto/frame_codec.h"
#include "proto/signing_input.h"

namespace bcd::pki {
namespace {

namespace v1 = bettercompute::agent::v1;

absl::StatusOr<std::vector<Certificate>> ParseAll(
    const google::protobuf::RepeatedPtrField<std::string>& ders, std::string_view what) {
  std::vector<Certificate> out;
  for (int i = 0; i < ders.size(); ++i) {
    absl::StatusOr<Certificate> cert = Certificate::FromDer(ders[i]);
    if (!cert.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("trust bundle {} {}: {}", what, i, ToStd(cert.status().message())));
    }
    out.push_back(*std::move(cert));
  }
  return out;
}

}  // namespace

std::string ApproverSet::ApproverSetInputOfEmpty() {
  return proto::ApproverSetInput(v1::TrustBundle());
}

absl::StatusOr<ApproverSet> ApproverSet::FromBundle(const v1::TrustBundle& bundle) {
  ApproverSet set;
  std::set<std::string> kids, spkis;
  for (const v1::ApproverKey& entry : bundle.approver_keys()) {
    absl::StatusOr<PublicKey> key = PublicKey::FromSpkiDer(entry.spki());
    if (!key.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("approver key \"{}\": {}", entry.kid(), ToStd(key.status().message())));
    }
    if (entry.kid().empty()) return absl::InvalidArgumentError("an approver key has no kid");
    if (!kids.insert(entry.kid()).second || !spkis.insert(entry.spki()).second) {
      return absl::InvalidArgumentError(
          fmt::format("approver key \"{}\" appears twice in the set", entry.kid()));
    }
    set.approvers_.push_back({entry.kid(), entry.spki(), *std::move(key)});
  }
  auto n = static_cast<uint32_t>(set.approvers_.size());
  if (n > 0 && (bundle.approver_threshold() < 1 || bundle.approver_threshold() > n)) {
    return absl::InvalidArgumentError(
        fmt::format("approver threshold {} is not between 1 and the {} approver keys",
                    bundle.approver_threshold(), n));
  }
  for (const v1::QuorumTier& tier : bundle.quorum_tiers()) {
    if (tier.threshold() < 1 || tier.threshold() > n) {
      return absl::InvalidArgumentError(fmt::format(
          "quorum tier for {} targets has threshold {}, not between 1 and the {} approver keys",
          tier.min_targets(), tier.threshold(), n));
    }
    set.tiers_.emplace_back(tier.min_targets(), tier.threshold());
  }
  set.threshold_ = bundle.approver_threshold();
  set.per_hour_ = bundle.unbatched_destructive_per_hour();
  set.epoch_ = bundle.approver_set_epoch();
  set.input_ = proto::ApproverSetInput(bundle);
  return set;
}

const Approver* ApproverSet::Find(std::string_view kid) const {
  for (const Approver& approver : approvers_) {
    if (approver.kid == kid) return &approver;
  }
  return nullptr;
}

uint32_t ApproverSet::ThresholdForBatch(std::size_t targets) const {
  uint32_t threshold = threshold_;
  uint32_t best_min = 0;
  bool found = false;
  for (auto [min_targets, tier_threshold] : tiers_) {
    if (min_targets <= targets && (!found || min_targets >= best_min)) {
      threshold = tier_threshold;
      best_min = min_targets;
      found = true;
    }
  }
  return threshold;
}

absl::StatusOr<TrustState> TrustState::Verify(const v1::SignedTrustBundle& signed_bundle,
                                              const PublicKey& join_service_key) {
  std::string input = proto::BodySigningInput(proto::Purpose::kTrustBundle, signed_bundle.body());
  if (absl::Status s = VerifyWithKey(input, signed_bundle.signature(), join_service_key); !s.ok()) {
    return absl::UnauthenticatedError(fmt::format(
        "trust bundle is not signed by the pinned JoinService key: {}", ToStd(s.message())));
  }
  TrustState state;
  if (absl::Status s = proto::DecodeMessage(signed_bundle.body(), &state.bundle_); !s.ok()) {
    return s;
  }
  absl::StatusOr<std::vector<Certificate>> roots =
      ParseAll(state.bundle_.command_signing_roots(), "command-signing root");
  if (!roots.ok()) return roots.status();
  absl::StatusOr<std::vector<Certificate>> cas = ParseAll(state.bundle_.node_ca(), "node CA");
  if (!cas.ok()) return cas.status();
  state.command_signing_roots_ = *std::move(roots);
  state.node_cas_ = *std::move(cas);
  state.signed_ = signed_bundle;
  state.approver_source_ = signed_bundle;
  return state;
}

absl::StatusOr<TrustState> TrustState::FromFirstBundle(const v1::SignedTrustBundle& signed_bundle,
                                                       const PublicKey& join_service_key) {
  absl::StatusOr<TrustState> state = Verify(signed_bundle, join_service_key);
  if (!state.ok()) return state;
  absl::StatusOr<ApproverSet> set = ApproverSet::FromBundle(state->bundle_);
  if (!set.ok()) return set.status();
  state->approvers_ = *std::move(set);
  return state;
}

absl::StatusOr<TrustState> TrustState::Restore(const v1::SignedTrustBundle& signed_bundle,
                                               const v1::SignedTrustBundle* approver_source,
                                               const PublicKey& join_service_key) {
  if (approver_source == nullptr) return FromFirstBundle(signed_bundle, join_service_key);
  absl::StatusOr<TrustState> state = Verify(signed_bundle, join_service_key);
  if (!state.ok()) return state;
  absl::StatusOr<TrustState> source = FromFirstBundle(*approver_source, join_service_key);
  if (!source.ok()) {
    return absl::Status(
        source.status().code(),
        fmt::format("the bundle of the held approver set: {}", ToStd(source.status().message())));
  }
  if (source->trust_domain() != state->trust_domain() || source->version() > state->version()) {
    return absl::InvalidArgumentError(fmt::format(
        "the bundle of the held approver set (version {}, trust domain {}) does not go with "
        "bundle version {} of {}",
        source->version(), source->trust_domain(), state->version(), state->trust_domain()));
  }
  state->approvers_ = source->approvers_;
  state->approver_source_ = *approver_source;
  return state;
}

absl::StatusOr<TrustState::Update> TrustState::Accept(const v1::SignedTrustBundle& signed_bundle,
                                                      const PublicKey& join_service_key) const {
  absl::StatusOr<TrustState> next = Verify(signed_bundle, join_service_key);
  if (!next.ok()) return next.status();
  if (next->version() <= version()) {
    return absl::FailedPreconditionError(
        fmt::format("trust bundle version {} is not greater than the version held, {}",
                    next->version(), version()));
  }
  if (next->trust_domain() != trust_domain()) {
    return absl::FailedPreconditionError(
        fmt::format("trust bundle is for trust domain \"{}\", this node is in \"{}\"",
                    next->trust_domain(), trust_domain()));
  }
  Update update{*std::move(next), ""};
  const ApproverSet& held = approvers_;
  absl::StatusOr<ApproverSet> candidate = ApproverSet::FromBundle(update.state.bundle_);
  auto keep = [&](std::string why) {
    update.state.approvers_ = held;
    update.state.approver_source_ = approver_source_;
    update.approver_set_refusal = std::move(why);
    return update;
  };
  if (!candidate.ok()) {
    return keep(fmt::format("approver set refused: {}", ToStd(candidate.status().message())));
  }
  uint64_t e = held.epoch(), e_new = candidate->epoch();
  if (held.empty() && e == 0) {
    update.state.approvers_ = *std::move(candidate);  // the first set comes with its bundle
    return update;
  }
  if (e_new == e) {
    if (candidate->SameSetAs(held)) {
      update.state.approvers_ = held;  // the same set: this bundle is as good a source of it
      return update;
    }
    return keep(
        fmt::format("approver set refused: it changes the set without raising its epoch {}", e));
  }
  if (e_new < e) {
    return keep(fmt::format("approver set refused: epoch {} is below the held epoch {}", e_new, e));
  }
  std::string input = proto::ApproverSetSigningInput(e_new, candidate->Sha256(), trust_domain());
  std::set<std::string> signers;
  for (const auto& signature : update.state.bundle_.approver_set_signatures()) {
    const Approver* approver = held.Find(signature.kid());
    if (approver != nullptr && approver->key.VerifyEs256(input, signature.sig()).ok()) {
      signers.insert(approver->kid);
    }
  }
  if (signers.size() < held.threshold()) {
    return keep(fmt::format(
        "approver set refused: the change to epoch {} is signed by {} of the current approvers, "
        "{} needed",
        e_new, signers.size(), held.threshold()));
  }
  update.state.approvers_ = *std::move(candidate);
  return update;
}

}  // namespace bcd::pki
