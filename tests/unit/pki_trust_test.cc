#include "gtest/gtest.h"
#include "pki/approvals.h"
#include "pki/envelope.h"
#include "pki/trust.h"
#include "proto/absl_compat.h"
#include "proto/signing_input.h"

namespace bcd::pki {
namespace {

namespace v1 = bettercompute::agent::v1;

std::string Message(const absl::Status& status) { return std::string(ToStd(status.message())); }

class Trust : public ::testing::Test {
 protected:
  Trust() {
    for (int i = 0; i < 4; ++i) approvers_.push_back(*PrivateKey::Generate());
  }

  // A bundle with approvers [first, first+count), threshold and epoch.
  v1::TrustBundle Bundle(uint64_t version, int first, int count, uint32_t threshold,
                         uint64_t epoch) {
    v1::TrustBundle bundle;
    bundle.set_trust_domain("example.net");
    bundle.set_version(version);
    for (int i = first; i < first + count; ++i) {
      auto* key = bundle.add_approver_keys();
      key->set_kid("a" + std::to_string(i));
      key->set_spki(approvers_[i].Public().SpkiDer());
    }
    bundle.set_approver_threshold(threshold);
    bundle.set_approver_set_epoch(epoch);
    return bundle;
  }

  // Approver i signs the bundle's set for its epoch.
  void ApproveSet(v1::TrustBundle* bundle, int i) {
    ApproverSet set = *ApproverSet::FromBundle(*bundle);
    std::string input = proto::ApproverSetSigningInput(bundle->approver_set_epoch(), set.Sha256(),
                                                       bundle->trust_domain());
    *bundle->add_approver_set_signatures() = *Sign(input, approvers_[i], "a" + std::to_string(i));
  }

  v1::SignedTrustBundle Signed(const v1::TrustBundle& bundle, const PrivateKey& key) {
    v1::SignedTrustBundle out;
    out.set_body(bundle.SerializeAsString());
    *out.mutable_signature() =
        *Sign(proto::BodySigningInput(proto::Purpose::kTrustBundle, out.body()), key, "join");
    return out;
  }
  v1::SignedTrustBundle Signed(const v1::TrustBundle& bundle) { return Signed(bundle, join_); }

  PrivateKey join_ = *PrivateKey::Generate();
  std::vector<PrivateKey> approvers_;
};

TEST_F(Trust, TakesTheFirstBundleAndItsSet) {
  TrustState state = *TrustState::FromFirstBundle(Signed(Bundle(1, 0, 3, 2, 1)), join_.Public());
  EXPECT_EQ(state.version(), 1u);
  EXPECT_EQ(state.approvers().approvers().size(), 3u);
  EXPECT_EQ(state.approvers().epoch(), 1u);
  EXPECT_EQ(state.approvers().Sha256(), Sha256(proto::ApproverSetInput(Bundle(1, 0, 3, 2, 1))));
}

TEST_F(Trust, RefusesABundleNotSignedByThePinnedKey) {
  absl::StatusOr<TrustState> state = TrustState::FromFirstBundle(
      Signed(Bundle(1, 0, 0, 0, 0), *PrivateKey::Generate()), join_.Public());
  EXPECT_EQ(state.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(
      Message(state.status()),
      "trust bundle is not signed by the pinned JoinService key: the signature does not verify");
}

TEST_F(Trust, RefusesAnOldOrEqualVersion) {
  TrustState state = *TrustState::FromFirstBundle(Signed(Bundle(5, 0, 0, 0, 0)), join_.Public());
  EXPECT_EQ(Message(state.Accept(Signed(Bundle(5, 0, 0, 0, 0)), join_.Public()).status()),
            "trust bundle version 5 is not greater than the version held, 5");
  EXPECT_EQ(Message(state.Accept(Signed(Bundle(4, 0, 0, 0, 0)), join_.Public()).status()),
            "trust bundle version 4 is not greater than the version held, 5");
}

TEST_F(Trust, RefusesALaterBundleFromAnotherSigner) {
  TrustState state = *TrustState::FromFirstBundle(Signed(Bundle(1, 0, 0, 0, 0)), join_.Public());
  EXPECT_EQ(state.Accept(Signed(Bundle(2, 0, 0, 0, 0), *PrivateKey::Generate()), join_.Public())
                .status()
                .code(),
            absl::StatusCode::kUnauthenticated);
}

TEST_F(Trust, RefusesAnotherTrustDomain) {
  TrustState state = *TrustState::FromFirstBundle(Signed(Bundle(1, 0, 0, 0, 0)), join_.Public());
  v1::TrustBundle other = Bundle(2, 0, 0, 0, 0);
  other.set_trust_domain("evil.net");
  EXPECT_EQ(Message(state.Accept(Signed(other), join_.Public()).status()),
            "trust bundle is for trust domain \"evil.net\", this node is in \"example.net\"");
}

TEST_F(Trust, RefusesMalformedRoots) {
  v1::TrustBundle bundle = Bundle(1, 0, 0, 0, 0);
  bundle.add_command_signing_roots("not a certificate");
  EXPECT_EQ(
      Message(TrustState::FromFirstBundle(Signed(bundle), join_.Public()).status()).substr(0, 53),
      "trust bundle command-signing root 0: not a DER certif");
}

TEST_F(Trust, TakesTheFirstNonEmptySetWithoutSignatures) {
  TrustState state = *TrustState::FromFirstBundle(Signed(Bundle(1, 0, 0, 0, 0)), join_.Public());
  auto update = *state.Accept(Signed(Bundle(2, 0, 2, 1, 1)), join_.Public());
  EXPECT_EQ(update.approver_set_refusal, "");
  EXPECT_EQ(update.state.approvers().approvers().size(), 2u);
}

TEST_F(Trust, TakesAChangeSignedByTheOldThreshold) {
  TrustState state = *TrustState::FromFirstBundle(Signed(Bundle(1, 0, 3, 2, 1)), join_.Public());
  v1::TrustBundle next = Bundle(2, 1, 3, 2, 2);  // a1..a3
  ApproveSet(&next, 0);
  ApproveSet(&next, 1);
  auto update = *state.Accept(Signed(next), join_.Public());
  EXPECT_EQ(update.approver_set_refusal, "");
  EXPECT_EQ(update.state.approvers().epoch(), 2u);
  EXPECT_NE(update.state.approvers().Find("a3"), nullptr);
}

TEST_F(Trust, KeepsTheSetWhenTooFewOldApproversSigned) {
  TrustState state = *TrustState::FromFirstBundle(Signed(Bundle(1, 0, 3, 2, 1)), join_.Public());
  v1::TrustBundle next = Bundle(2, 1, 3, 1, 2);
  ApproveSet(&next, 0);
  ApproveSet(&next, 0);  // the same approver twice counts once
  ApproveSet(&next, 3);  // a3 is not in the held set
  auto update = *state.Accept(Signed(next), join_.Public());
  EXPECT_EQ(
      update.approver_set_refusal,
      "approver set refused: the change to epoch 2 is signed by 1 of the current approvers, 2 "
      "needed");
  EXPECT_EQ(update.state.version(), 2u) << "the rest of the bundle applies";
  EXPECT_EQ(update.state.approvers().epoch(), 1u);
  EXPECT_TRUE(update.state.approvers().SameSetAs(state.approvers()));
}

TEST_F(Trust, TheSameSetAtAHigherEpochStillNeedsTheQuorum) {
  TrustState state = *TrustState::FromFirstBundle(Signed(Bundle(1, 0, 3, 2, 1)), join_.Public());
  auto update = *state.Accept(Signed(Bundle(2, 0, 3, 2, 2)), join_.Public());
  EXPECT_EQ(
      update.approver_set_refusal,
      "approver set refused: the change to epoch 2 is signed by 0 of the current approvers, 2 "
      "needed");
  EXPECT_EQ(update.state.approvers().epoch(), 1u);
}

TEST_F(Trust, RefusesAChangeAtTheSameOrALowerEpoch) {
  TrustState state = *TrustState::FromFirstBundle(Signed(Bundle(1, 0, 3, 2, 5)), join_.Public());
  EXPECT_EQ(state.Accept(Signed(Bundle(2, 0, 2, 1, 5)), join_.Public())->approver_set_refusal,
            "approver set refused: it changes the set without raising its epoch 5");
  EXPECT_EQ(state.Accept(Signed(Bundle(2, 0, 3, 2, 4)), join_.Public())->approver_set_refusal,
            "approver set refused: epoch 4 is below the held epoch 5");
  EXPECT_EQ(state.Accept(Signed(Bundle(2, 0, 3, 2, 5)), join_.Public())->approver_set_refusal, "");
}

TEST_F(Trust, RefusesAnInvalidSet) {
  TrustState state = *TrustState::FromFirstBundle(Signed(Bundle(1, 0, 0, 0, 0)), join_.Public());
  EXPECT_EQ(state.Accept(Signed(Bundle(2, 0, 2, 3, 1)), join_.Public())->approver_set_refusal,
            "approver set refused: approver threshold 3 is not between 1 and the 2 approver keys");
  v1::TrustBundle dup = Bundle(2, 0, 2, 1, 1);
  dup.mutable_approver_keys(1)->set_kid("a0");
  EXPECT_EQ(state.Accept(Signed(dup), join_.Public())->approver_set_refusal,
            "approver set refused: approver key \"a0\" appears twice in the set");
}

TEST_F(Trust, ASignatureUnderAHeldKidCountsOnlyWhenItVerifies) {
  TrustState state = *TrustState::FromFirstBundle(Signed(Bundle(1, 0, 3, 2, 1)), join_.Public());
  v1::TrustBundle next = Bundle(2, 1, 3, 2, 2);
  ApproveSet(&next, 0);
  // Under the held kid "a1", but made by another key: it names a1, it is not a1's.
  ApproverSet set = *ApproverSet::FromBundle(next);
  *next.add_approver_set_signatures() =
      *Sign(proto::ApproverSetSigningInput(2, set.Sha256(), next.trust_domain()),
            *PrivateKey::Generate(), "a1");
  auto update = *state.Accept(Signed(next), join_.Public());
  EXPECT_EQ(
      update.approver_set_refusal,
      "approver set refused: the change to epoch 2 is signed by 1 of the current approvers, 2 "
      "needed");
  EXPECT_EQ(update.state.approvers().epoch(), 1u);
}

TEST_F(Trust, OneKeyUnderTwoKidsIsRefusedAndCannotMeetAQuorum) {
  v1::TrustBundle twice = Bundle(1, 0, 2, 2, 1);
  twice.mutable_approver_keys(1)->set_spki(approvers_[0].Public().SpkiDer());  // a1 = a0's key
  absl::StatusOr<ApproverSet> set = ApproverSet::FromBundle(twice);
  EXPECT_EQ(Message(set.status()), "approver key \"a1\" appears twice in the set");
  TrustState state = *TrustState::FromFirstBundle(Signed(Bundle(1, 0, 0, 0, 0)), join_.Public());
  twice.set_version(2);
  EXPECT_EQ(state.Accept(Signed(twice), join_.Public())->approver_set_refusal,
            "approver set refused: approver key \"a1\" appears twice in the set");
}

// Approvals of destructive commands.
class Approvals : public Trust {
 protected:
  Approvals() {
    v1::TrustBundle bundle = Bundle(1, 0, 4, 2, 1);
    auto* tier = bundle.add_quorum_tiers();
    tier->set_min_targets(10);
    tier->set_threshold(3);
    set_ = *ApproverSet::FromBundle(bundle);
    command_.set_command_id("c-1");
    command_.set_node_id("n-1");
    command_.set_kind("disk.wipe");
    body_ = command_.SerializeAsString();
  }

  void Approve(int i, std::string_view digest_of) {
    *approvals_.Add() = *Sign(proto::ApproveSigningInput(Sha256(digest_of)), approvers_[i],
                              "a" + std::to_string(i));
  }

  absl::Status Check(std::string_view manifest = "") {
    return CheckApprovals(body_, command_, approvals_, manifest, "n-1", set_);
  }

  std::string Manifest(int targets, bool name_us = true) {
    v1::BatchManifest manifest;
    manifest.set_batch_id("b-1");
    manifest.set_kind("disk.wipe");
    for (int i = 0; i < targets; ++i) {
      auto* t = manifest.add_targets();
      t->set_node_id(i == 0 && name_us ? "n-1" : "n-x" + std::to_string(i));
      t->set_command_id(i == 0 && name_us ? "c-1" : "c-x" + std::to_string(i));
    }
    command_.set_batch_id("b-1");
    body_ = command_.SerializeAsString();
    return manifest.SerializeAsString();
  }

  ApproverSet set_;
  v1::Command command_;
  std::string body_;
  google::protobuf::RepeatedPtrField<bettercompute::common::v1::Signature> approvals_;
};

TEST_F(Approvals, UnbatchedNeedsTheThreshold) {
  Approve(0, body_);
  EXPECT_EQ(Message(Check()), "1 of 2 approvals needed");
  EXPECT_EQ(Check().code(), absl::StatusCode::kPermissionDenied);
  Approve(3, body_);
  EXPECT_TRUE(Check().ok());
}

TEST_F(Approvals, RefusesADuplicateSigner) {
  Approve(0, body_);
  Approve(0, body_);
  EXPECT_EQ(Message(Check()), "two approvals by the same key \"a0\"");
}

TEST_F(Approvals, RefusesAnUnknownKey) {
  Approve(0, body_);
  *approvals_.Add() =
      *Sign(proto::ApproveSigningInput(Sha256(body_)), *PrivateKey::Generate(), "stranger");
  EXPECT_EQ(Message(Check()), "approval by unknown key \"stranger\"");
}

TEST_F(Approvals, RefusesABadSignatureAsBadSignature) {
  Approve(0, body_);
  Approve(1, "some other body");
  absl::Status status = Check();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Message(status), "approval by \"a1\" does not verify: the signature does not verify");
}

TEST_F(Approvals, BatchedUsesTheTierForItsSize) {
  std::string small = Manifest(3);
  Approve(0, small);
  Approve(1, small);
  EXPECT_TRUE(Check(small).ok());
  approvals_.Clear();
  std::string big = Manifest(12);
  Approve(0, big);
  Approve(1, big);
  EXPECT_EQ(Message(Check(big)), "2 of 3 approvals needed for a batch of this size");
  Approve(2, big);
  EXPECT_TRUE(Check(big).ok());
}

TEST_F(Approvals, RefusesAManifestThatDoesNotNameThisCommand) {
  std::string manifest = Manifest(3, /*name_us=*/false);
  Approve(0, manifest);
  Approve(1, manifest);
  EXPECT_EQ(Message(Check(manifest)),
            "batch manifest does not name node \"n-1\" with command \"c-1\"");
}

TEST_F(Approvals, RefusesAManifestOfAnotherBatch) {
  std::string manifest = Manifest(3);
  command_.set_batch_id("b-2");
  EXPECT_EQ(Message(Check(manifest)),
            "batch manifest is for batch \"b-1\" of disk.wipe, the command is in batch \"b-2\" of "
            "disk.wipe");
}

TEST_F(Approvals, RefusesAManifestThatDoesNotDecode) {
  command_.set_batch_id("b-1");
  EXPECT_EQ(Check("\xff\xff").code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(Approvals, AnEmptySetApprovesEverything) {
  EXPECT_TRUE(CheckApprovals(body_, command_, approvals_, "", "n-1", ApproverSet()).ok());
}

TEST(HourlyLimit, CountsOverASlidingHour) {
  HourlyLimit limit;
  EXPECT_TRUE(limit.Take(1000, 2).ok());
  EXPECT_TRUE(limit.Take(2000, 2).ok());
  absl::Status full = limit.Take(3000, 2);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(std::string(ToStd(full.message())),
            "2 unbatched destructive commands in the last hour, the limit is 2");
  EXPECT_TRUE(limit.Take(4600, 2).ok()) << "the first one left the hour";
  EXPECT_TRUE(limit.Take(4601, 0).ok()) << "0 means no limit";
}

}  // namespace
}  // namespace bcd::pki
