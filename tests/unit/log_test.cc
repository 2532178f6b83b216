#include "base/log.h"

#include <sstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

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

TEST(Logger, JsonLinesParseAndKeepEveryField) {
  std::ostringstream out;
  Logger log(&out, LogLevel::kInfo);
  log.set_format(LogFormat::kJson);
  log.Warn("command.rejected",
           {{"message", "a \"quoted\" \\ line\nbreak\ttab\x01"}, {"bytes", "ok\xff\xc0\x80é€😀"}});
  std::string line = out.str();
  ASSERT_EQ(Count(line, "\n"), 1) << "one line per event";
  nlohmann::json parsed = nlohmann::json::parse(line);  // throws on anything not JSON
  EXPECT_EQ(parsed["level"], "warn");
  EXPECT_EQ(parsed["event"], "command.rejected");
  EXPECT_EQ(parsed["message"], "a \"quoted\" \\ line\nbreak\ttab\x01");
  // Bytes that are not UTF-8 (a stray 0xff, an overlong NUL) become U+FFFD; the rest stays.
  EXPECT_EQ(parsed["bytes"], "ok\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBDé€😀");
}

TEST(Logger, JsonKeepsThePriorityPrefixAndSaysWhatWasSuppressed) {
  std::ostringstream out;
  Logger log(&out, LogLevel::kInfo);
  log.set_format(LogFormat::kJson);
  log.set_priority_prefix(true);
  auto now = std::chrono::steady_clock::time_point{};
  log.set_clock([&] { return now; });
  for (int i = 0; i < Logger::kBurst + 3; ++i) log.Error("outbox.full");
  now += Logger::kWindow;
  out.str("");
  log.Error("outbox.full");
  std::string line = out.str();
  ASSERT_TRUE(line.starts_with("<3>{")) << line;
  nlohmann::json parsed = nlohmann::json::parse(line.substr(3));
  EXPECT_EQ(parsed["suppressed"], "3");
}

}  // namespace
}  // namespace bcd
