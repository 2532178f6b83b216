#include "base/metrics.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace bcd {
namespace {

TEST(Metrics, CountersAndGaugesAreWrittenInTheTextFormat) {
  Metrics metrics;
  CounterFamily& frames = metrics.Counter("bcd_frames_total", "Frames by case", {"case"});
  frames.Add({"command"});
  frames.Add({"command"}, 2);
  frames.Add({"ack"});
  metrics.Gauge("bcd_session_up", "Whether a session is up").Set({}, 1);
  std::string text = metrics.Text();
  EXPECT_NE(text.find("# HELP bcd_frames_total Frames by case\n# TYPE bcd_frames_total counter\n"
                      "bcd_frames_total{case=\"ack\"} 1\nbcd_frames_total{case=\"command\"} 3\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("# TYPE bcd_session_up gauge\nbcd_session_up 1\n"), std::string::npos);
}

TEST(Metrics, AnUnlabelledFamilyIsZeroFromTheStart) {
  Metrics metrics;
  metrics.Counter("bcd_renewals_total", "Renewals");
  EXPECT_NE(metrics.Text().find("\nbcd_renewals_total 0\n"), std::string::npos);
}

TEST(Metrics, LabelValuesAndHelpAreEscaped) {
  Metrics metrics;
  metrics.Counter("x_total", "a \\ and a\nline", {"v"}).Add({"q\"b\\s\nn"});
  std::string text = metrics.Text();
  EXPECT_NE(text.find("# HELP x_total a \\\\ and a\\nline\n"), std::string::npos) << text;
  EXPECT_NE(text.find("x_total{v=\"q\\\"b\\\\s\\nn\"} 1\n"), std::string::npos) << text;
}

TEST(Metrics, CollectorsAreReadAtEachCollection) {
  Metrics metrics;
  double depth = 3;
  metrics.Collect("bcd_outbox_entries", "Outbox entries", MetricType::kGauge, {}, [&] {
    return std::vector<Sample>{{{}, depth}};
  });
  EXPECT_NE(metrics.Text().find("\nbcd_outbox_entries 3\n"), std::string::npos);
  depth = 7;
  EXPECT_NE(metrics.Text().find("\nbcd_outbox_entries 7\n"), std::string::npos);
  metrics.Forget("bcd_outbox_entries");
  EXPECT_EQ(metrics.Text().find("bcd_outbox_entries"), std::string::npos);
}

TEST(Metrics, ANewLabelSetPastTheBoundIsDroppedAndCounted) {
  Metrics metrics;
  CounterFamily& family = metrics.Counter("bcd_x_total", "x", {"reason"});
  for (std::size_t i = 0; i < Family::kMaxSeries + 10; ++i) family.Add({std::to_string(i)});
  family.Add({"0"});  // a label set it already holds still counts
  std::string text = metrics.Text();
  EXPECT_NE(text.find("\nbcd_metrics_series_dropped_total 10\n"), std::string::npos) << text;
  EXPECT_NE(text.find("bcd_x_total{reason=\"0\"} 2\n"), std::string::npos);
  EXPECT_EQ(text.find("bcd_x_total{reason=\"" + std::to_string(Family::kMaxSeries) + "\"}"),
            std::string::npos);
}

TEST(Metrics, RegisteringAgainReturnsTheSameFamily) {
  Metrics metrics;
  metrics.Counter("bcd_y_total", "y", {"a"}).Add({"1"});
  metrics.Counter("bcd_y_total", "y", {"a"}).Add({"1"});
  EXPECT_NE(metrics.Text().find("bcd_y_total{a=\"1\"} 2\n"), std::string::npos);
}

TEST(Metrics, ConcurrentAddsAreAllCounted) {
  Metrics metrics;
  CounterFamily& family = metrics.Counter("bcd_z_total", "z", {"t"});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) family.Add({"same"});
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_NE(metrics.Text().find("bcd_z_total{t=\"same\"} 40000\n"), std::string::npos);
}

TEST(Metrics, NamesAreChecked) {
  EXPECT_TRUE(ValidMetricName("bcd_a:b_total"));
  EXPECT_FALSE(ValidMetricName("1abc"));
  EXPECT_FALSE(ValidMetricName("a-b"));
  EXPECT_FALSE(ValidMetricName(""));
  EXPECT_TRUE(ValidMetricName("kind", true));
  EXPECT_FALSE(ValidMetricName("a:b", true));
  EXPECT_FALSE(ValidMetricName("__name", true));
  EXPECT_DEATH(Metrics().Counter("bad-name", "x"), "not a metric name");
  EXPECT_DEATH(
      {
        Metrics m;
        m.Counter("bcd_w_total", "w", {"a"});
        m.Gauge("bcd_w_total", "w", {"a"});
      },
      "another type or labels");
}

TEST(Metrics, ProcessFiguresComeFromProc) {
  Metrics metrics;
  AddProcessMetrics(metrics);
  double rss = -1, threads = -1, fds = -1;
  for (const FamilySnapshot& family : metrics.Snapshot()) {
    ASSERT_FALSE(family.samples.empty() && family.label_names.empty()) << family.name;
    if (family.name == "process_resident_memory_bytes") rss = family.samples[0].value;
    if (family.name == "process_threads") threads = family.samples[0].value;
    if (family.name == "process_open_fds") fds = family.samples[0].value;
  }
  EXPECT_GT(rss, 1 << 20);  // a running test binary holds more than a megabyte
  EXPECT_GE(threads, 1);
  EXPECT_GE(fds, 3);  // stdin, stdout, stderr at least
}

}  // namespace
}  // namespace bcd
