#include "base/metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "fmt/format.h"

namespace bcd {
namespace {

// Label values: backslash, double quote and line feed escaped. HELP: backslash and line feed.
std::string Escape(std::string_view text, bool quote) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

std::string Number(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", value);
}

[[noreturn]] void Misuse(const std::string& what) {
  std::fprintf(stderr, "bcd: metrics registry misused: %s\n", what.c_str());
  std::abort();
}

void CheckNames(std::string_view name, const std::vector<std::string>& labels) {
  if (!ValidMetricName(name)) Misuse(fmt::format("\"{}\" is not a metric name", name));
  for (const std::string& label : labels) {
    if (!ValidMetricName(label, true)) {
      Misuse(fmt::format("\"{}\" of {} is not a label name", label, name));
    }
  }
}

void AddRelaxed(std::atomic<double>* cell, double n) {
  double seen = cell->load(std::memory_order_relaxed);
  while (!cell->compare_exchange_weak(seen, seen + n, std::memory_order_relaxed)) {
  }
}

}  // namespace

bool ValidMetricName(std::string_view name, bool label) {
  if (name.empty() || (label && name.starts_with("__"))) return false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    bool ok = letter || (!label && c == ':') || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

std::atomic<double>* Family::Cell(std::initializer_list<std::string_view> values) {
  if (values.size() != labels_.size()) return nullptr;
  std::vector<std::string> key(values.begin(), values.end());
  MutexLock lock(mu_);
  auto it = cells_.find(key);
  if (it != cells_.end()) return it->second.get();
  if (cells_.size() >= kMaxSeries) {
    dropped_->fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  auto cell = std::make_unique<std::atomic<double>>(0.0);
  std::atomic<double>* raw = cell.get();
  cells_.emplace(std::move(key), std::move(cell));
  return raw;
}

FamilySnapshot Family::Collect() const {
  FamilySnapshot snapshot{name_, help_, type_, labels_, {}};
  MutexLock lock(mu_);
  snapshot.samples.reserve(cells_.size());
  for (const auto& [values, cell] : cells_) {
    snapshot.samples.push_back({values, cell->load(std::memory_order_relaxed)});
  }
  return snapshot;
}

void Counter::Add(double n) const {
  if (cell_ != nullptr && n >= 0) AddRelaxed(cell_, n);
}

std::string StatusLabel(const absl::Status& status) {
  std::string label = absl::StatusCodeToString(status.code());
  for (char& c : label) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return label;
}

std::string EnumLabel(std::string_view name, std::string_view prefix) {
  if (name.starts_with(prefix)) name.remove_prefix(prefix.size());
  std::string label(name);
  for (char& c : label) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return label;
}

void CounterFamily::Add(std::initializer_list<std::string_view> values, double n) {
  if (!(n >= 0)) return;  // a counter only goes up
  if (std::atomic<double>* cell = Cell(values)) AddRelaxed(cell, n);
}

void GaugeFamily::Set(std::initializer_list<std::string_view> values, double value) {
  if (std::atomic<double>* cell = Cell(values)) cell->store(value, std::memory_order_relaxed);
}

void GaugeFamily::Add(std::initializer_list<std::string_view> values, double delta) {
  if (std::atomic<double>* cell = Cell(values)) AddRelaxed(cell, delta);
}

Metrics::Metrics() {
  Collect("bcd_metrics_series_dropped_total",
          "Updates of a new label set dropped because its family already held the most it may",
          MetricType::kCounter, {}, [this] {
            return std::vector<Sample>{
                {{}, static_cast<double>(dropped_.load(std::memory_order_relaxed))}};
          });
}

Family* Metrics::Find(std::string_view name, MetricType type,
                      const std::vector<std::string>& labels) {
  CheckNames(name, labels);
  if (collected_.contains(name)) Misuse(fmt::format("{} is registered as collected", name));
  auto it = families_.find(name);
  if (it == families_.end()) return nullptr;
  FamilySnapshot shape = it->second->Collect();
  if (shape.type != type || shape.label_names != labels) {
    Misuse(fmt::format("{} registered again with another type or labels", name));
  }
  return it->second.get();
}

CounterFamily& Metrics::Counter(std::string_view name, std::string_view help,
                                std::vector<std::string> labels) {
  MutexLock lock(mu_);
  if (Family* found = Find(name, MetricType::kCounter, labels)) {
    return static_cast<CounterFamily&>(*found);
  }
  bool plain = labels.empty();
  auto family = std::make_unique<CounterFamily>(std::string(name), std::string(help),
                                                MetricType::kCounter, std::move(labels), &dropped_);
  if (plain) family->Add({}, 0);  // an unlabelled counter is 0 from the start, not absent
  CounterFamily& ref = *family;
  families_.emplace(std::string(name), std::move(family));
  return ref;
}

GaugeFamily& Metrics::Gauge(std::string_view name, std::string_view help,
                            std::vector<std::string> labels) {
  MutexLock lock(mu_);
  if (Family* found = Find(name, MetricType::kGauge, labels)) {
    return static_cast<GaugeFamily&>(*found);
  }
  bool plain = labels.empty();
  auto family = std::make_unique<GaugeFamily>(std::string(name), std::string(help),
                                              MetricType::kGauge, std::move(labels), &dropped_);
  if (plain) family->Add({}, 0);
  GaugeFamily& ref = *family;
  families_.emplace(std::string(name), std::move(family));
  return ref;
}

void Metrics::Collect(std::string_view name, std::string_view help, MetricType type,
                      std::vector<std::string> labels, Collector collect) {
  CheckNames(name, labels);
  MutexLock lock(mu_);
  if (families_.contains(name)) Misuse(fmt::format("{} is registered as set", name));
  collected_[std::string(name)] =
      Collected{std::string(help), type, std::move(labels), std::move(collect)};
}

void Metrics::Forget(std::string_view name) {
  {
    MutexLock lock(mu_);
    if (auto it = collected_.find(name); it != collected_.end()) collected_.erase(it);
  }
  MutexLock wait(collect_mu_);  // a collection that copied the collector has finished with it
}

std::vector<FamilySnapshot> Metrics::Snapshot() const {
  std::vector<FamilySnapshot> out;
  std::vector<std::pair<FamilySnapshot, Collector>> pending;
  MutexLock collecting(collect_mu_);
  {
    MutexLock lock(mu_);
    for (const auto& [name, family] : families_) out.push_back(family->Collect());
    for (const auto& [name, c] : collected_) {
      pending.emplace_back(FamilySnapshot{name, c.help, c.type, c.labels, {}}, c.collect);
    }
  }
  // Collectors run without the registry's lock: they take their owners' locks, and an owner may
  // register or update a family holding its own.
  for (auto& [snapshot, collect] : pending) {
    for (Sample& sample : collect()) {
      if (sample.labels.size() == snapshot.label_names.size()) {
        snapshot.samples.push_back(std::move(sample));
      }
    }
    std::sort(snapshot.samples.begin(), snapshot.samples.end(),
              [](const Sample& a, const Sample& b) { return a.labels < b.labels; });
    out.push_back(std::move(snapshot));
  }
  std::sort(out.begin(), out.end(),
            [](const FamilySnapshot& a, const FamilySnapshot& b) { return a.name < b.name; });
  return out;
}

std::string Metrics::Text() const {
  std::string out;
  for (const FamilySnapshot& family : Snapshot()) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", family.name, Escape(family.help, false),
                       family.name, family.type == MetricType::kCounter ? "counter" : "gauge");
    for (const Sample& sample : family.samples) {
      out += family.name;
      if (!sample.labels.empty()) {
        out += '{';
        for (std::size_t i = 0; i < sample.labels.size(); ++i) {
          if (i > 0) out += ',';
          out += fmt::format("{}=\"{}\"", family.label_names[i], Escape(sample.labels[i], true));
        }
        out += '}';
      }
      out += ' ' + Number(sample.value) + '\n';
    }
  }
  return out;
}

namespace {

// Fields of /proc/self/stat after the command name: state is field 3 (index 0 here).
std::vector<std::string> StatFields() {
  std::ifstream in("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::size_t close = text.rfind(')');
  if (close == std::string::npos) return {};
  std::istringstream rest(text.substr(close + 1));
  std::vector<std::string> fields;
  for (std::string field; rest >> field;) fields.push_back(field);
  return fields;
}

double BootTime() {
  std::ifstream in("/proc/stat");
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("btime ")) return std::strtod(line.c_str() + 6, nullptr);
  }
  return 0;
}

double CountFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  double count = 0;
  while (dirent* entry = readdir(dir)) count += entry->d_name[0] != '.';
  closedir(dir);
  return count - 1;  // the directory's own fd
}

std::vector<Sample> One(double value) { return {{{}, value}}; }

}  // namespace

void AddProcessMetrics(Metrics& metrics) {
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  // Field indexes after the command name: utime 11, stime 12, num_threads 17, starttime 19,
  // vsize 20, rss 21 (proc(5) numbers them from 1 with pid and comm first: 14, 15, 20, 22, 23, 24).
  auto stat = [](std::size_t index) {
    std::vector<std::string> fields = StatFields();
    return index < fields.size() ? std::strtod(fields[index].c_str(), nullptr) : 0.0;
  };
  metrics.Collect("process_resident_memory_bytes", "Resident memory size in bytes",
                  MetricType::kGauge, {}, [=] { return One(stat(21) * page); });
  metrics.Collect("process_virtual_memory_bytes", "Virtual memory size in bytes",
                  MetricType::kGauge, {}, [=] { return One(stat(20)); });
  metrics.Collect("process_cpu_seconds_total", "User and system CPU time spent in seconds",
                  MetricType::kCounter, {}, [=] { return One((stat(11) + stat(12)) / ticks); });
  metrics.Collect("process_threads", "Threads of the process", MetricType::kGauge, {},
                  [=] { return One(stat(17)); });
  double start = BootTime() + stat(19) / ticks;
  metrics.Collect("process_start_time_seconds", "Start time of the process since the epoch",
                  MetricType::kGauge, {}, [=] { return One(start); });
  metrics.Collect("process_open_fds", "Open file descriptors", MetricType::kGauge, {},
                  [] { return One(CountFds()); });
  metrics.Collect("process_max_fds", "The most file descriptors the process may open",
                  MetricType::kGauge, {}, [] {
                    rlimit limit{};
                    getrlimit(RLIMIT_NOFILE, &limit);
                    return One(static_cast<double>(limit.rlim_cur));
                  });
}

}  // namespace bcd
