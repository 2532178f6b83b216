#include "daemon/delivery/results.h"

#include "gtest/gtest.h"
#include "proto/absl_compat.h"
#include "tests/unit/fake_root.h"

namespace bcd {
namespace {

namespace v1 = bettercompute::agent::v1;
using bcd::testing::FakeRoot;

v1::CommandUpdate Done(const std::string& id,
                       v1::CommandState state = v1::COMMAND_STATE_SUCCEEDED) {
  v1::CommandUpdate update;
  update.set_command_id(id);
  update.set_state(state);
  update.set_result("result of " + id);
  return update;
}

TEST(ResultStore, RemembersTerminalResultsAcrossARestart) {
  FakeRoot dir;
  {
    ResultStore store = *ResultStore::Open(dir.path(), 1000);
    ASSERT_TRUE(store.MarkRunning("c-1", "inventory.refresh").ok());
    ASSERT_TRUE(store.Remember(Done("c-1"), 1001).ok());
  }
  ResultStore store = *ResultStore::Open(dir.path(), 2000);
  ASSERT_TRUE(store.Terminal("c-1").has_value());
  EXPECT_EQ(store.Terminal("c-1")->result(), "result of c-1");
  EXPECT_FALSE(store.Running("c-1"));
  EXPECT_FALSE(store.Terminal("c-2").has_value());
}

TEST(ResultStore, ARestartFindsTheCommandsItInterrupted) {
  FakeRoot dir;
  {
    ResultStore store = *ResultStore::Open(dir.path(), 1000);
    ASSERT_TRUE(store.MarkRunning("c-1", "disk.wipe").ok());
    ASSERT_TRUE(store.MarkRunning("c-2", "inventory.refresh").ok());
    ASSERT_TRUE(store.Remember(Done("c-2"), 1001).ok());
  }
  ResultStore store = *ResultStore::Open(dir.path(), 1002);
  EXPECT_EQ(store.running(), (std::map<std::string, std::string>{{"c-1", "disk.wipe"}}));
}

TEST(ResultStore, ForgetsResultsOlderThanADay) {
  FakeRoot dir;
  {
    ResultStore store = *ResultStore::Open(dir.path(), 1000);
    ASSERT_TRUE(store.Remember(Done("old"), 1000).ok());
    ASSERT_TRUE(store.Remember(Done("new"), 1000 + ResultStore::kKeepSeconds).ok());
  }
  {
    ResultStore store = *ResultStore::Open(dir.path(), 1001 + ResultStore::kKeepSeconds);
    EXPECT_FALSE(store.Terminal("old").has_value());
    EXPECT_TRUE(store.Terminal("new").has_value());
  }
  ResultStore again = *ResultStore::Open(dir.path(), 1002 + ResultStore::kKeepSeconds);
  EXPECT_FALSE(again.Terminal("old").has_value());
  EXPECT_TRUE(again.Terminal("new").has_value());
}

TEST(ResultStore, ALongRunningDaemonForgetsAndCompactsWhileRunning) {
  FakeRoot dir;
  ResultStore store = *ResultStore::Open(dir.path(), 1000);
  for (int i = 0; i < 1000; ++i) {
    std::string id = "c-" + std::to_string(i);
    ASSERT_TRUE(store.MarkRunning(id, "inventory.refresh").ok());
    ASSERT_TRUE(store.Remember(Done(id), 1000).ok());
  }
  auto size_before = std::filesystem::file_size(dir.path() / "results.log");
  // A day and an hour later, the next result forgets all of them and rewrites the log.
  ASSERT_TRUE(store.Remember(Done("late"), 1000 + ResultStore::kKeepSeconds + 3600).ok());
  EXPECT_EQ(store.size(), 1u);
  EXPECT_LT(std::filesystem::file_size(dir.path() / "results.log"), size_before / 100);
  ResultStore reopened = *ResultStore::Open(dir.path(), 1000 + ResultStore::kKeepSeconds + 3601);
  EXPECT_TRUE(reopened.Terminal("late").has_value());
  EXPECT_FALSE(reopened.Terminal("c-1").has_value());
}

TEST(ResultStore, ResultsReadBackFromDiskAfterACompactionMovedThem) {
  FakeRoot dir;
  ResultStore store = *ResultStore::Open(dir.path(), 1000);
  for (int i = 0; i < 1000; ++i) {
    std::string id = "c-" + std::to_string(i);
    ASSERT_TRUE(store.MarkRunning(id, "node.reboot").ok());
    ASSERT_TRUE(store.Remember(Done(id), 1000).ok());
  }
  auto before = std::filesystem::file_size(dir.path() / "results.log");
  // An hour later the next result compacts: the running markers go, the results stay.
  ASSERT_TRUE(store.Remember(Done("late"), 4600).ok());
  EXPECT_LT(std::filesystem::file_size(dir.path() / "results.log"), before);
  EXPECT_EQ(store.size(), 1001u);
  for (int i : {0, 499, 999}) {
    std::string id = "c-" + std::to_string(i);
    ASSERT_TRUE(store.Terminal(id).has_value()) << id;
    EXPECT_EQ(store.Terminal(id)->result(), "result of " + id);
  }
  EXPECT_EQ(store.Terminal("late")->result(), "result of late");
  EXPECT_FALSE(store.Terminal("c-1000").has_value());
  ResultStore reopened = *ResultStore::Open(dir.path(), 4601);
  EXPECT_EQ(reopened.Terminal("c-499")->result(), "result of c-499");
  EXPECT_TRUE(reopened.running().empty());
}

TEST(RecordLog, ReadsARecordAtItsOffsetAndNamesDamage) {
  FakeRoot dir;
  std::vector<std::string> records;
  std::vector<uint64_t> offsets;
  {
    RecordLog log = *RecordLog::Open(dir.path() / "log", &records);
    ASSERT_TRUE(log.Append("first").ok());
    ASSERT_TRUE(log.Append("second").ok());
  }
  RecordLog log = *RecordLog::Open(dir.path() / "log", &records, &offsets);
  ASSERT_EQ(offsets, (std::vector<uint64_t>{8, 25})) << "after the magic, 12 header bytes each";
  EXPECT_EQ(*log.Read(25), "second");
  EXPECT_EQ(log.Read(13).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(std::string(ToStd(log.Read(100).status().message())),
            (dir.path() / "log").string() + ": no record at byte 100");
  std::vector<uint64_t> rewritten;
  ASSERT_TRUE(log.Rewrite({"x", "second"}, &rewritten).ok());
  EXPECT_EQ(rewritten, (std::vector<uint64_t>{8, 21}));
  EXPECT_EQ(*log.Read(21), "second");
}

TEST(ResultStore, ReconcileRecordsTerminalUpdatesFoundInTheOutbox) {
  FakeRoot dir;
  ResultStore store = *ResultStore::Open(dir.path(), 1000);
  ASSERT_TRUE(store.MarkRunning("c-1", "node.reboot").ok());
  ASSERT_TRUE(store.MarkRunning("c-2", "node.reboot").ok());
  std::deque<v1::AgentFrame> pending(3);
  *pending[0].mutable_command_update() = Done("c-1", v1::COMMAND_STATE_RUNNING);
  *pending[1].mutable_command_update() = Done("c-1");
  pending[2].mutable_event()->set_kind("identity.renewed");
  EXPECT_EQ(*store.Reconcile(pending, 1001), 1);
  EXPECT_EQ(store.running(), (std::map<std::string, std::string>{{"c-2", "node.reboot"}}))
      << "c-2 has no terminal update anywhere: it was interrupted";
  EXPECT_EQ(store.Terminal("c-1")->result(), "result of c-1");
  EXPECT_EQ(*store.Reconcile(pending, 1002), 0) << "recorded once";
}

TEST(ResultStore, TheHourlyCountSurvivesARestart) {
  FakeRoot dir;
  {
    ResultStore store = *ResultStore::Open(dir.path(), 1000);
    ASSERT_TRUE(store.TakeHourly(1000, 2).ok());
    ASSERT_TRUE(store.TakeHourly(1100, 2).ok());
    EXPECT_EQ(store.TakeHourly(1200, 2).code(), absl::StatusCode::kResourceExhausted);
  }
  ResultStore store = *ResultStore::Open(dir.path(), 1300);
  absl::Status limited = store.TakeHourly(1300, 2);
  EXPECT_EQ(limited.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(std::string(ToStd(limited.message())),
            "2 unbatched destructive commands in the last hour, the limit is 2");
  EXPECT_TRUE(store.TakeHourly(4600, 2).ok()) << "the one taken at 1000 is past its hour";
}

TEST(ResultStore, ACorruptRecordIsNamed) {
  FakeRoot dir;
  {
    std::vector<std::string> records;
    RecordLog log = *RecordLog::Open(dir.path() / "results.log", &records);
    ASSERT_TRUE(log.Append("X-not-a-result").ok());
  }
  absl::StatusOr<ResultStore> store = ResultStore::Open(dir.path(), 0);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(std::string(ToStd(store.status().message())),
            (dir.path() / "results.log").string() + ": record 0 is not a command result");
}

}  // namespace
}  // namespace bcd
