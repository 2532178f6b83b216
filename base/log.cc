#include "base/log.h"

#include <sstream>

#include "base/mutex.h"

namespace bcd {

std::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

namespace {

std::string Quote(const std::string& value) {
  bool plain = !value.empty() && value.find_first_of(" \"=\n\t") == std::string::npos;
  if (plain) return value;
  std::string out = "\"";
  for (char c : value) {
    if (c == '"' || c == '\\') out += '\\';
    out += c == '\n' ? ' ' : c;
  }
  return out + "\"";
}

}  // namespace

void Logger::Log(LogLevel level, std::string_view event,
                 std::initializer_list<std::pair<std::string_view, std::string>> fields) {
  if (static_cast<int>(level) < static_cast<int>(level_.load()) || out_ == nullptr) return;
  // sd-daemon(3) / syslog(3) priorities of debug, info, warn, error: 7, 6, 4, 3.
  static constexpr std::string_view kPriority[] = {"<7>", "<6>", "<4>", "<3>"};
  std::string line(priority_prefix_ ? kPriority[static_cast<int>(level)] : "");
  line += "level=" + std::string(LogLevelName(level)) + " event=" + std::string(event);
  for (const auto& [key, value] : fields) line += " " + std::string(key) + "=" + Quote(value);
  MutexLock lock(mu_);
  if (level >= LogLevel::kWarn) {
    auto now = clock_();
    auto [it, fresh] = windows_.try_emplace(std::string(event), Window{now});
    Window& window = it->second;
    if (now - window.start >= kWindow) {
      if (window.suppressed > 0) line += " suppressed=" + std::to_string(window.suppressed);
      window = Window{now};
    }
    if (window.lines >= kBurst) {
      ++window.suppressed;
      return;
    }
    ++window.lines;
  }
  *out_ << line << "\n" << std::flush;
}

std::string Logger::Text() {
  MutexLock lock(mu_);
  auto* text = dynamic_cast<std::ostringstream*>(out_);
  return text == nullptr ? "" : text->str();
}

}  // namespace bcd
