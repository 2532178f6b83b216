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

// A JSON string: quotes, backslashes and control characters escaped, and each byte that is not
// part of a well-formed UTF-8 sequence replaced by U+FFFD.
std::string JsonString(std::string_view value) {
  std::string out = "\"";
  for (std::size_t i = 0; i < value.size();) {
    auto c = static_cast<unsigned char>(value[i]);
    if (c < 0x80) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += static_cast<char>(c);
      } else if (c < 0x20) {
        static constexpr char kHex[] = "0123456789abcdef";
        out += "\\u00";
        out += kHex[c >> 4];
        out += kHex[c & 15];
      } else {
        out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    // The length the lead byte announces, and the range its first continuation byte must be in
    // (no overlong forms, no surrogates, nothing past U+10FFFF).
    std::size_t length = 0;
    unsigned char low = 0x80, high = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      length = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      length = 3;
      if (c == 0xE0) low = 0xA0;
      if (c == 0xED) high = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      length = 4;
      if (c == 0xF0) low = 0x90;
      if (c == 0xF4) high = 0x8F;
    }
    bool good = length > 0 && i + length <= value.size();
    for (std::size_t k = 1; good && k < length; ++k) {
      auto next = static_cast<unsigned char>(value[i + k]);
      good = k == 1 ? next >= low && next <= high : next >= 0x80 && next <= 0xBF;
    }
    if (good) {
      out.append(value.substr(i, length));
      i += length;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out + "\"";
}

}  // namespace

void Logger::Log(LogLevel level, std::string_view event,
                 std::initializer_list<std::pair<std::string_view, std::string>> fields) {
  if (static_cast<int>(level) < static_cast<int>(level_.load()) || out_ == nullptr) return;
  MutexLock lock(mu_);
  uint64_t suppressed = 0;  // lines of this event left out in the last window, said now
  if (level >= LogLevel::kWarn) {
    auto now = clock_();
    auto [it, fresh] = windows_.try_emplace(std::string(event), Window{now});
    Window& window = it->second;
    if (now - window.start >= kWindow) {
      suppressed = window.suppressed;
      window = Window{now};
    }
    if (window.lines >= kBurst) {
      ++window.suppressed;
      return;
    }
    ++window.lines;
  }
  // sd-daemon(3) / syslog(3) priorities of debug, info, warn, error: 7, 6, 4, 3.
  static constexpr std::string_view kPriority[] = {"<7>", "<6>", "<4>", "<3>"};
  std::string line(priority_prefix_ ? kPriority[static_cast<int>(level)] : "");
  std::string count = std::to_string(suppressed);
  if (format_ == LogFormat::kJson) {
    line += "{\"level\":" + JsonString(LogLevelName(level)) + ",\"event\":" + JsonString(event);
    for (const auto& [key, value] : fields) line += "," + JsonString(key) + ":" + JsonString(value);
    if (suppressed > 0) line += ",\"suppressed\":" + JsonString(count);
    line += "}";
  } else {
    line += "level=" + std::string(LogLevelName(level)) + " event=" + std::string(event);
    for (const auto& [key, value] : fields) line += " " + std::string(key) + "=" + Quote(value);
    if (suppressed > 0) line += " suppressed=" + count;
  }
  *out_ << line << "\n" << std::flush;
}

std::string Logger::Text() {
  MutexLock lock(mu_);
  auto* text = dynamic_cast<std::ostringstream*>(out_);
  return text == nullptr ? "" : text->str();
}

}  // namespace bcd
