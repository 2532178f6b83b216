#include "proto/version.h"

#include "gtest/gtest.h"
#include "proto/absl_compat.h"

namespace bcd::proto {
namespace {

ProtocolRange Range(int64_t min, int64_t max) { return *ProtocolRange::Make(min, max); }

TEST(ProtocolVersion, ThisBuildSpeaksOneToOne) {
  EXPECT_EQ(kProtocolVersion.min(), 1u);
  EXPECT_EQ(kProtocolVersion.max(), 1u);
  EXPECT_EQ(kProtocolVersion.ToString(), "1..1");
}

TEST(Negotiate, PicksTheHighestSharedVersion) {
  EXPECT_EQ(*Negotiate(Range(1, 3), Range(1, 1)), (Negotiated{1, false}));
  EXPECT_EQ(*Negotiate(Range(1, 3), Range(1, 2)), (Negotiated{2, false}));
  EXPECT_EQ(*Negotiate(Range(1, 1), Range(1, 1)), (Negotiated{1, false}));
  EXPECT_EQ(*Negotiate(Range(1, 2), Range(2, 5)), (Negotiated{2, false}));
}

TEST(Negotiate, DaemonBelowTheGatewayMinimumGetsUpgradeRequiredAtTheMinimum) {
  EXPECT_EQ(*Negotiate(Range(2, 3), Range(1, 1)), (Negotiated{2, true}));
}

TEST(Negotiate, DaemonAboveTheGatewayIsRefused) {
  absl::StatusOr<Negotiated> result = Negotiate(Range(1, 1), Range(2, 3));
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ToStd(result.status().message()),
            "daemon protocol range 2..3 is above the gateway's 1..1");
}

TEST(ProtocolRange, RejectsInvalidRangesAsInvalidConfig) {
  auto message = [](const absl::StatusOr<ProtocolRange>& r) {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(ToStd(r.status().message()));
  };
  EXPECT_EQ(message(ProtocolRange::Make(0, 1)),
            "INVALID_CONFIG: protocol range minimum 0 is below 1");
  EXPECT_EQ(message(ProtocolRange::Make(-1, 1)),
            "INVALID_CONFIG: protocol range minimum -1 is below 1");
  EXPECT_EQ(message(ProtocolRange::Make(3, 2)),
            "INVALID_CONFIG: protocol range maximum 2 is below its minimum 3");
  EXPECT_EQ(message(ProtocolRange::Make(1, int64_t{1} << 33)),
            "INVALID_CONFIG: protocol range maximum 8589934592 is out of range");
  EXPECT_EQ(message(ProtocolRange::Parse("1.5..3")),
            "INVALID_CONFIG: protocol range \"1.5..3\" is not MIN..MAX with integer bounds");
  for (std::string_view bad :
       {"", "..", "1..", "..2", "a..b", "1..2..3", " 1..2", "0x1..2", "+1..2"}) {
    EXPECT_FALSE(ProtocolRange::Parse(bad).ok()) << bad;
  }
  EXPECT_EQ(message(ProtocolRange::Parse("0..2")),
            "INVALID_CONFIG: protocol range minimum 0 is below 1");
}

TEST(ProtocolRange, ParsesRangesAndSingleVersions) {
  EXPECT_EQ(*ProtocolRange::Parse("1..3"), Range(1, 3));
  EXPECT_EQ(*ProtocolRange::Parse("2"), Range(2, 2));
  EXPECT_TRUE(Range(1, 3).Contains(3));
  EXPECT_FALSE(Range(1, 3).Contains(4));
}

TEST(CheckWelcomeVersion, AcceptsAVersionInsideTheDaemonRange) {
  EXPECT_TRUE(CheckWelcomeVersion(Range(1, 2), 2, false).ok());
  EXPECT_TRUE(CheckWelcomeVersion(Range(1, 1), 2, true).ok());
}

TEST(CheckWelcomeVersion, RefusesAVersionTheDaemonDoesNotSpeak) {
  absl::Status status = CheckWelcomeVersion(Range(1, 1), 2, false);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ToStd(status.message()),
            "Welcome chose protocol version 2, outside this daemon's range 1..1");
  status = CheckWelcomeVersion(Range(1, 2), 2, true);
  EXPECT_EQ(ToStd(status.message()),
            "Welcome says upgrade required at version 2, which this daemon (1..2) already speaks");
}

}  // namespace
}  // namespace bcd::proto
