#include "daemon/upgrade/trial.h"

#include <sys/stat.h>

#include "base/files.h"
#include "gtest/gtest.h"
#include "tests/unit/fake_root.h"

namespace bcd::upgrade {
namespace {

using testing::FakeRoot;

std::string Read(const std::filesystem::path& path) {
  absl::StatusOr<std::string> text = ReadWholeFile(path, 1 << 20);
  return text.ok() ? *text : "(missing)";
}

class TrialFiles : public ::testing::Test {
 protected:
  TrialFiles() {
    root_.Write("bin/bcd", "old binary");
    std::filesystem::create_directories(root_.path() / "state");
  }
  Layout layout() const {
    return {.binary = root_.path() / "bin/bcd", .state_dir = root_.path() / "state"};
  }
  Trial OnTrial() const {
    return {.command_id = "c-1",
            .from = "0.1.0",
            .to = "0.2.0",
            .began = 100,
            .deadline = 200,
            .starts = 1,
            .stage = Stage::kTrial,
            .argv = {"/usr/bin/bcd", "node"},
            .binary = layout().binary.string()};
  }
  FakeRoot root_;
};

TEST_F(TrialFiles, SwapKeepsThePreviousAndRestorePutsItBack) {
  root_.Write("bin/.bcd.download", "new binary");
  ASSERT_TRUE(KeepPrevious(layout()).ok());
  EXPECT_EQ(Read(layout().previous()), "old binary");
  EXPECT_EQ(Read(layout().binary), "old binary");  // never missing
  ASSERT_TRUE(Install(layout()).ok());
  EXPECT_EQ(Read(layout().binary), "new binary");
  EXPECT_FALSE(std::filesystem::exists(layout().download()));
  ASSERT_TRUE(Restore(layout()).ok());
  EXPECT_EQ(Read(layout().binary), "old binary");
  EXPECT_EQ(Read(layout().previous()), "old binary");  // kept
  EXPECT_FALSE(std::filesystem::exists(layout().binary.string() + ".tmp"));
}

TEST_F(TrialFiles, TheMarkerRoundTripsAndACorruptOneIsNamed) {
  EXPECT_FALSE(ReadTrial(layout())->has_value());
  ASSERT_TRUE(WriteTrial(layout(), OnTrial()).ok());
  struct stat st {};
  ASSERT_EQ(stat(layout().dir().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  std::optional<Trial> read = *ReadTrial(layout());
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->command_id, "c-1");
  EXPECT_EQ(read->to, "0.2.0");
  EXPECT_EQ(read->deadline, 200);
  EXPECT_EQ(read->starts, 1);
  EXPECT_EQ(read->stage, Stage::kTrial);
  EXPECT_EQ(read->argv, (std::vector<std::string>{"/usr/bin/bcd", "node"}));
  EXPECT_EQ(read->binary, layout().binary.string());
  root_.Write("state/upgrade/trial.json", "{\"command_id\": 1}");
  absl::StatusOr<std::optional<Trial>> corrupt = ReadTrial(layout());
  EXPECT_TRUE(absl::IsDataLoss(corrupt.status()));
  EXPECT_NE(corrupt.status().message().find("trial.json"), std::string::npos);
  ASSERT_TRUE(ClearTrial(layout()).ok());
  EXPECT_FALSE(ReadTrial(layout())->has_value());
}

TEST_F(TrialFiles, TheHighestVersionOnlyRises) {
  EXPECT_FALSE(ReadHighest(layout())->has_value());
  ASSERT_TRUE(RecordHighest(layout(), *Semver::Parse("1.2.0")).ok());
  ASSERT_TRUE(RecordHighest(layout(), *Semver::Parse("1.1.9")).ok());
  EXPECT_EQ((*ReadHighest(layout()))->ToString(), "1.2.0");
  ASSERT_TRUE(RecordHighest(layout(), *Semver::Parse("1.10.0")).ok());
  EXPECT_EQ((*ReadHighest(layout()))->ToString(), "1.10.0");
  root_.Write("state/upgrade/highest", "one point two\n");
  EXPECT_TRUE(absl::IsDataLoss(ReadHighest(layout()).status()));
}

TEST(TrialDecide, WhatAStartingVersionDoes) {
  Trial trial{.from = "0.1.0", .to = "0.2.0", .starts = 0, .stage = Stage::kTrial};
  EXPECT_EQ(Decide(std::nullopt, "0.1.0"), Verdict::kNothing);
  EXPECT_EQ(Decide(trial, "0.2.0"), Verdict::kOnTrial);
  EXPECT_EQ(Decide(trial, "0.1.0"), Verdict::kReport);  // the swap never ran, or was undone
  trial.starts = 1;
  EXPECT_EQ(Decide(trial, "0.2.0"), Verdict::kRollBack);  // a second start of the new version
  trial.stage = Stage::kSwapping;
  trial.starts = 0;
  EXPECT_EQ(Decide(trial, "0.2.0"), Verdict::kOnTrial);  // renamed in, the marker not yet moved on
  EXPECT_EQ(Decide(trial, "0.1.0"), Verdict::kReport);
  trial.stage = Stage::kConfirmed;
  EXPECT_EQ(Decide(trial, "0.2.0"), Verdict::kConfirm);
  trial.stage = Stage::kRolledBack;
  EXPECT_EQ(Decide(trial, "0.1.0"), Verdict::kReport);
}

TEST_F(TrialFiles, RecoverRollsBackAnUnfinishedTrialOnly) {
  EXPECT_EQ(*Recover(layout()), "no upgrade under way");
  root_.Write("bin/.bcd.download", "new binary");
  ASSERT_TRUE(KeepPrevious(layout()).ok());
  ASSERT_TRUE(Install(layout()).ok());
  Trial trial = OnTrial();
  trial.stage = Stage::kConfirmed;
  ASSERT_TRUE(WriteTrial(layout(), trial).ok());
  EXPECT_EQ(*Recover(layout()), "the upgrade to 0.2.0 is confirmed");
  EXPECT_EQ(Read(layout().binary), "new binary");
  ASSERT_TRUE(WriteTrial(layout(), OnTrial()).ok());
  absl::StatusOr<std::string> done = Recover(layout());
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_NE(done->find("rolled back to 0.1.0"), std::string::npos) << *done;
  EXPECT_EQ(Read(layout().binary), "old binary");
  std::optional<Trial> after = *ReadTrial(layout());
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(after->stage, Stage::kRolledBack);
  EXPECT_NE(after->reason.find("stopped during its trial"), std::string::npos);
}

TEST_F(TrialFiles, StatusShowsWhatIsKeptAndWhatHappened) {
  nlohmann::json status = UpgradeStatus(layout());
  EXPECT_EQ(status["binary"], layout().binary.string());
  EXPECT_TRUE(status["previous_binary"].is_null());
  EXPECT_TRUE(status["highest"].is_null());
  EXPECT_TRUE(status["last"].is_null());
  EXPECT_TRUE(status["under_way"].is_null());
  ASSERT_TRUE(KeepPrevious(layout()).ok());
  ASSERT_TRUE(RecordHighest(layout(), *Semver::Parse("0.2.0")).ok());
  ASSERT_TRUE(RecordLast(layout(), R"({"outcome": "succeeded"})").ok());
  ASSERT_TRUE(WriteTrial(layout(), OnTrial()).ok());
  status = UpgradeStatus(layout());
  EXPECT_EQ(status["previous_binary"], layout().previous().string());
  EXPECT_EQ(status["highest"], "0.2.0");
  EXPECT_EQ(status["last"]["outcome"], "succeeded");
  EXPECT_EQ(status["under_way"]["stage"], "trial");
  EXPECT_EQ(status["under_way"]["to"], "0.2.0");
}

}  // namespace
}  // namespace bcd::upgrade
