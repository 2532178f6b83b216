#include "daemon/liveness.h"

#include <mutex>

#include "gtest/gtest.h"
#include "testing/wait.h"

namespace bcd {
namespace {

using std::chrono::milliseconds;

TEST(Liveness, ALockHeldForeverFailsTheCheckAndItsReleasePassesItAgain) {
  std::mutex shared;  // what the engine's threads share
  Liveness liveness([&] { std::lock_guard<std::mutex> probe(shared); }, milliseconds(20));
  EXPECT_TRUE(liveness.Check().ok());
  shared.lock();  // a thread that never lets go
  ASSERT_TRUE(testing::WaitFor([&] { return !liveness.Check().ok(); }, std::chrono::seconds(10)));
  EXPECT_TRUE(absl::IsUnavailable(liveness.Check()));
  EXPECT_NE(liveness.Check().message().find("has not answered for"), std::string::npos)
      << liveness.Check();
  shared.unlock();
  EXPECT_TRUE(testing::WaitFor([&] { return liveness.Check().ok(); }, std::chrono::seconds(10)));
}

TEST(Liveness, ReadingTheCheckNeverWaitsForTheProbe) {
  std::mutex shared;
  shared.lock();
  Liveness liveness([&] { std::lock_guard<std::mutex> probe(shared); }, milliseconds(20));
  // The probe is stuck from the start; the check answers all the same (were it to wait for the
  // probe, this would hang until the unlock that never comes before it, and the test time out),
  // and it soon says the engine does not answer.
  EXPECT_TRUE(testing::WaitFor([&] { return !liveness.Check().ok(); }, std::chrono::seconds(10)));
  shared.unlock();
}

}  // namespace
}  // namespace bcd
