#include "testing/child_process.h"

#include <signal.h>

#include <chrono>

#include "gtest/gtest.h"

namespace bcd::testing {
namespace {

TEST(WaitChild, ReturnsTheExitStatusOrTheSignal) {
  EXPECT_EQ(WaitChild(SpawnChild({"sh", "-c", "exit 3"})), 3);
  EXPECT_EQ(WaitChild(SpawnChild({"sh", "-c", "kill -TERM $$"})), 128 + SIGTERM);
}

// A child that never ends is killed at the limit, and the wait says so instead of hanging.
TEST(WaitChild, KillsAChildStillRunningAtTheLimit) {
  pid_t child = SpawnChild({"sleep", "600"});
  ASSERT_GT(child, 0);
  EXPECT_EQ(WaitChild(child, std::chrono::seconds(1)), kStillRunning);
  EXPECT_NE(kill(child, 0), 0) << "the child was reaped";
}

}  // namespace
}  // namespace bcd::testing
