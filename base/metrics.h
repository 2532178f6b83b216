#pragma once

// The one metrics registry of a daemon: counters and gauges in labelled families, read at once as
// Prometheus text (the diagnostics listener's /metrics) or as a list of samples (what another
// exporter walks). Parts of the engine and the mode register their families when they start and
// move them as they work; values that already live elsewhere (the outbox's depth, the process's
// memory) are read when the registry is collected, through a collector.
//
//   Metrics metrics;
//   CounterFamily& frames = metrics.Counter("bcd_frames_received_total", "...", {"case"});
//   frames.Add({"command"});
//
// Every call is thread-safe. A family holds at most kMaxSeries label sets: past that an update of a
// new one is dropped and counted in bcd_metrics_series_dropped_total, so a peer that sends
// ever-new values cannot grow the registry without bound. Names and label names are checked when
// registered (a wrong one is a bug: it aborts); label values are escaped when written.

#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "base/mutex.h"

namespace bcd {

enum class MetricType { kCounter, kGauge };

// One value of a family: its label values (in the family's label order) and the value.
struct Sample {
  std::vector<std::string> labels;
  double value = 0;
};

// A family as collected: what it is and its samples, sorted by label values.
struct FamilySnapshot {
  std::string name;
  std::string help;
  MetricType type = MetricType::kCounter;
  std::vector<std::string> label_names;
  std::vector<Sample> samples;
};

class Family {
 public:
  static constexpr std::size_t kMaxSeries = 256;
  Family(std::string name, std::string help, MetricType type, std::vector<std::string> labels,
         std::atomic<uint64_t>* dropped)
      : name_(std::move(name)),
        help_(std::move(help)),
        type_(type),
        labels_(std::move(labels)),
        dropped_(dropped) {}
  Family(const Family&) = delete;
  Family& operator=(const Family&) = delete;
  FamilySnapshot Collect() const;
  const std::string& name() const { return name_; }

 protected:
  // The cell of `values` (created at 0), or nullptr past kMaxSeries or when the count of values
  // is not the family's count of labels (a bug, said in debug builds).
  std::atomic<double>* Cell(std::initializer_list<std::string_view> values);

 private:
  const std::string name_, help_;
  const MetricType type_;
  const std::vector<std::string> labels_;
  std::atomic<uint64_t>* const dropped_;
  mutable Mutex mu_;
  // Nodes of a std::map stay where they are: a cell's address is kept by callers.
  std::map<std::vector<std::string>, std::unique_ptr<std::atomic<double>>> cells_
      ABSL_GUARDED_BY(mu_);
};

// One counter of a family, bound once (no lookup when it moves); a default one counts nothing.
class Counter {
 public:
  Counter() = default;
  explicit Counter(std::atomic<double>* cell) : cell_(cell) {}
  void Add(double n = 1) const;

 private:
  std::atomic<double>* cell_ = nullptr;
};

class CounterFamily : public Family {
 public:
  using Family::Family;
  // Adds `n` (>= 0) to the counter of `values`.
  void Add(std::initializer_list<std::string_view> values, double n = 1);
  // The counter of `values`, for a caller that moves it often.
  Counter Bind(std::initializer_list<std::string_view> values) { return Counter(Cell(values)); }
};

class GaugeFamily : public Family {
 public:
  using Family::Family;
  void Set(std::initializer_list<std::string_view> values, double value);
  void Add(std::initializer_list<std::string_view> values, double delta);
};

class Metrics {
 public:
  // Families that read values kept elsewhere, when collected: returns the samples of now.
  using Collector = std::function<std::vector<Sample>()>;

  Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // The family of that name, created on first use; registering a name again with another type or
  // other labels is a bug (aborts).
  CounterFamily& Counter(std::string_view name, std::string_view help,
                         std::vector<std::string> labels = {});
  GaugeFamily& Gauge(std::string_view name, std::string_view help,
                     std::vector<std::string> labels = {});
  // A family whose samples `collect` gives at each collection (and that nothing sets).
  void Collect(std::string_view name, std::string_view help, MetricType type,
               std::vector<std::string> labels, Collector collect);
  // Removes a collector; once it returns, no collection is running it (its owner may go away).
  // Families set by Add/Set stay.
  void Forget(std::string_view name);

  // Every family, sorted by name.
  std::vector<FamilySnapshot> Snapshot() const;
  // The Prometheus text exposition format, version 0.0.4.
  std::string Text() const;
  static constexpr std::string_view kContentType = "text/plain; version=0.0.4; charset=utf-8";

 private:
  struct Collected {
    std::string help;
    MetricType type;
    std::vector<std::string> labels;
    Collector collect;
  };
  Family* Find(std::string_view name, MetricType type, const std::vector<std::string>& labels)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::atomic<uint64_t> dropped_{0};
  // Held while collectors run (one collection at a time), so Forget can wait them out.
  mutable Mutex collect_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable Mutex mu_;
  std::map<std::string, std::unique_ptr<Family>, std::less<>> families_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Collected, std::less<>> collected_ ABSL_GUARDED_BY(mu_);
};

// A status as a label value: "ok", or its code in lower case ("not_found", "unavailable").
std::string StatusLabel(const absl::Status& status);
// An enum's proto name as a label value: the prefix dropped and lower case
// ("COMMAND_STATE_SUCCEEDED" with prefix "COMMAND_STATE_" is "succeeded").
std::string EnumLabel(std::string_view name, std::string_view prefix);

// Whether `name` may name a metric ([a-zA-Z_:][a-zA-Z0-9_:]*) or, with `label`, a label
// ([a-zA-Z_][a-zA-Z0-9_]*, not starting with "__").
bool ValidMetricName(std::string_view name, bool label = false);

// The process's own figures, as the Prometheus client libraries name them: resident memory, open
// fds, threads, start time, CPU seconds (read from /proc/self at each collection).
void AddProcessMetrics(Metrics& metrics);

}  // namespace bcd
