#include "base/log.h"

#include <sstream>

#include "gtest/gtest.h"

namespace bcd {
namespace {

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(Logger, WarningsOfOneEventAreLimitedPerMinuteAndTheRestCounted) {
  std::ostringstream out;
  Logger log(&out, LogLevel::kInfo);
  auto now = std::chrono::steady_clock::time_point{};
  log.set_clock([&] { return now; });
  // A peer that sends a refused frame without end.
  for (int i = 0; i < 10000; ++i) log.Warn("command.rejected", {{"n", std::to_string(i)}});
  log.Warn("other.event");
  for (int i = 0; i < 50; ++i) log.Info("command.done");
  EXPECT_EQ(Count(out.str(), "event=command.rejected"), Logger::kBurst);
  EXPECT_EQ(Count(out.str(), "event=other.event"), 1) << "each event has its own limit";
  EXPECT_EQ(Count(out.str(), "event=command.done"), 50) << "info lines are not limited";
  now += Logger::kWindow;
  log.Warn("command.rejected", {{"n", "next"}});
  EXPECT_NE(out.str().find("level=warn event=command.rejected n=next suppressed=" +
                           std::to_string(10000 - Logger::kBurst) + "\n"),
            std::string::npos);
  log.Warn("command.rejected", {{"n", "after"}});
  EXPECT_NE(out.str().find("level=warn event=command.rejected n=after\n"), std::string::npos);
}

}  // namespace
}  // namespace bcd
