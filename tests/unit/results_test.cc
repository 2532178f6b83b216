#include "daemon/results.h"

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
  EXPECT_FALSE(again.Terminal("old").has_value()) << "the rewritten log no longer holds it";
  EXPECT_TRUE(again.Terminal("new").has_value());
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
