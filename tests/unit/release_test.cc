#include "daemon/upgrade/release.h"

#include "gtest/gtest.h"
#include "pki/keys.h"
#include "proto/signing_input.h"
#include "tests/unit/pki_fixtures.h"

namespace bcd::upgrade {
namespace {

namespace v1 = bettercompute::agent::v1;

Semver V(std::string_view text) {
  std::optional<Semver> v = Semver::Parse(text);
  EXPECT_TRUE(v) << text;
  return v.value_or(Semver{});
}

TEST(Semver, ParsesWhatSemverAllowsAndNothingElse) {
  for (const char* good : {"0.0.0", "1.2.3", "10.20.30", "1.0.0-alpha", "1.0.0-alpha.1",
                           "1.0.0-0.3.7", "1.0.0-x.7.z.92", "1.0.0-x-y-z.--"}) {
    ASSERT_TRUE(Semver::Parse(good)) << good;
    EXPECT_EQ(Semver::Parse(good)->ToString(), good);
  }
  for (const char* bad : {"", "1", "1.2", "1.2.3.4", "01.2.3", "1.02.3", "1.2.03", "v1.2.3",
                          "1.2.3-", "1.2.3-01", "1.2.3-a..b", "1.2.3+build", "1.2.3-a+b", " 1.2.3",
                          "1.2.3 ", "-1.2.3", "1.2.x", "99999999999999999999.0.0"}) {
    EXPECT_FALSE(Semver::Parse(bad)) << bad;
  }
}

TEST(Semver, PrecedenceIsSemvers) {
  // semver.org §11, in order.
  const char* ordered[] = {"1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta",
                           "1.0.0-beta",  "1.0.0-beta.2",  "1.0.0-beta.11",
                           "1.0.0-rc.1",  "1.0.0",         "1.0.1",
                           "1.1.0",       "2.0.0",         "10.0.0"};
  for (std::size_t i = 0; i < std::size(ordered); ++i) {
    for (std::size_t j = 0; j < std::size(ordered); ++j) {
      int expected = i < j ? -1 : i > j ? 1 : 0;
      EXPECT_EQ(Compare(V(ordered[i]), V(ordered[j])), expected)
          << ordered[i] << " vs " << ordered[j];
    }
  }
}

TEST(OsArch, NamesTheTwoArchitecturesReleasesAreSignedFor) {
  EXPECT_EQ(OsArch("x86_64"), "linux/amd64");
  EXPECT_EQ(OsArch("aarch64"), "linux/arm64");
  EXPECT_EQ(OsArch("riscv64"), "");
}

// The release Node's crypto signed (tests/interop/make-node-fixtures.mjs), and the policy of a
// node that pins its key and runs 1.4.1.
class Release : public ::testing::Test {
 protected:
  Release() {
    const nlohmann::json& r = testing::NodeFixtures()["release"];
    payload_.set_version(r["version"]);
    payload_.set_url("https://releases.example.net/bcd-1.4.2");
    payload_.set_sha256(testing::FromHex(r["sha256"]));
    payload_.set_signature(testing::FromHex(r["sig"]));
    payload_.set_release_key_spki(testing::FromHex(r["spki"]));
    spki_pem_ = r["spki_pem"];
    policy_.pins = {*Sha256Pin::ParseHex(pki::Hex(pki::Sha256(payload_.release_key_spki())))};
    policy_.os_arch = r["os_arch"];
    policy_.running = "1.4.1";
    policy_.read_file = [this](const std::filesystem::path&) -> absl::StatusOr<std::string> {
      return spki_pem_;
    };
  }
  absl::Status Verify() const { return VerifyRelease(payload_, policy_); }
  v1::DaemonUpgradePayload payload_;
  ReleasePolicy policy_;
  std::string spki_pem_;
};

TEST_F(Release, ANodeSignedReleaseVerifiesWithThePinByHashOrByPem) {
  EXPECT_TRUE(Verify().ok()) << Verify();
  payload_.set_release_key(pki::Hex(pki::Sha256(payload_.release_key_spki())));
  EXPECT_TRUE(Verify().ok()) << Verify();
  policy_.pins = {std::filesystem::path("/etc/bcd/release.pem")};
  EXPECT_TRUE(Verify().ok()) << Verify();
}

TEST_F(Release, WithoutPinsTheKindIsUnsupported) {
  policy_.pins.clear();
  EXPECT_TRUE(absl::IsUnimplemented(Verify()));
  EXPECT_NE(Verify().message().find("replace the binary by hand"), std::string::npos);
}

TEST_F(Release, AKeyNotPinnedIsRefused) {
  policy_.pins = {*Sha256Pin::ParseHex(std::string(64, 'a'))};
  EXPECT_TRUE(absl::IsPermissionDenied(Verify())) << Verify();
  spki_pem_ = pki::PrivateKey::Generate()->Public().ToPem();
  policy_.pins = {std::filesystem::path("/etc/bcd/release.pem")};
  EXPECT_TRUE(absl::IsPermissionDenied(Verify())) << Verify();
}

TEST_F(Release, TheSignatureCoversTheVersionTheArchitectureAndTheHash) {
  policy_.os_arch = "linux/arm64";  // signed for amd64
  EXPECT_TRUE(absl::IsPermissionDenied(Verify())) << Verify();
  policy_.os_arch = "linux/amd64";
  std::string sha = payload_.sha256();
  sha[0] ^= 1;  // a tampered binary's hash
  payload_.set_sha256(sha);
  EXPECT_TRUE(absl::IsPermissionDenied(Verify())) << Verify();
  sha[0] ^= 1;
  payload_.set_sha256(sha);
  payload_.set_version("1.4.3");
  EXPECT_TRUE(absl::IsPermissionDenied(Verify())) << Verify();
}

TEST_F(Release, NoOlderVersionAndNotTheOneRunning) {
  policy_.running = "1.4.2";
  EXPECT_TRUE(absl::IsFailedPrecondition(Verify()));
  EXPECT_NE(Verify().message().find("the one running"), std::string::npos) << Verify();
  policy_.running = "1.5.0";
  EXPECT_TRUE(absl::IsFailedPrecondition(Verify()));
  EXPECT_NE(Verify().message().find("lower than 1.5.0"), std::string::npos) << Verify();
  policy_.running = "1.4.1";
  policy_.highest = V("1.4.3");  // ran here once, before a rollback of some later release
  EXPECT_TRUE(absl::IsFailedPrecondition(Verify()));
  EXPECT_NE(Verify().message().find("lower than 1.4.3"), std::string::npos) << Verify();
}

TEST_F(Release, MalformedFieldsAreNamed) {
  v1::DaemonUpgradePayload good = payload_;
  payload_.set_url("http://releases.example.net/bcd");
  EXPECT_TRUE(absl::IsInvalidArgument(Verify()));
  EXPECT_NE(Verify().message().find("https"), std::string::npos);
  payload_ = good;
  payload_.set_version("1.4");
  EXPECT_TRUE(absl::IsInvalidArgument(Verify()));
  payload_ = good;
  payload_.set_sha256("short");
  EXPECT_TRUE(absl::IsInvalidArgument(Verify()));
  payload_ = good;
  payload_.set_release_key_spki("not a key");
  EXPECT_TRUE(absl::IsInvalidArgument(Verify()));
  payload_ = good;
  payload_.set_release_key(std::string(64, 'b'));
  EXPECT_TRUE(absl::IsInvalidArgument(Verify())) << "release_key must name the key sent";
}

}  // namespace
}  // namespace bcd::upgrade
