// Arbitrary bytes as one HTTP request to the diagnostics listener.

#include <cstdint>
#include <sstream>
#include <string_view>

#include "base/metrics.h"
#include "daemon/diag.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::ostringstream sink;
  static bcd::Logger log(&sink, bcd::LogLevel::kError);
  static bcd::Metrics metrics;
  static bcd::DiagServer* server = [] {
    metrics.Counter("bcd_x_total", "x", {"case"}).Add({"a\"b"});
    return bcd::DiagServer::Start(
               {.listen = {"127.0.0.1", 0},
                .metrics = [] { return metrics.Text(); },
                .healthy = [] { return absl::OkStatus(); },
                .ready = [] { return absl::UnavailableError("no session: backoff"); }},
               &log)
        ->release();
  }();
  std::string answer =
      server->AnswerBytes(std::string_view(reinterpret_cast<const char*>(data), size));
  // Whatever came in, the answer is a whole HTTP/1.1 response or nothing yet.
  if (!answer.empty() && !answer.starts_with("HTTP/1.1 ")) __builtin_trap();
  return 0;
}
