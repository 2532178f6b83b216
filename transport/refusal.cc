#include "transport/refusal.h"

#include <algorithm>
#include <charconv>
#include <functional>

#include "fmt/format.h"

namespace bcd::transport {
namespace {

std::optional<int64_t> Number(std::string_view text) {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value < 0)
    return std::nullopt;
  return value;
}

std::optional<std::chrono::milliseconds> Pushback(
    const std::function<std::optional<std::string>(const char*)>& header) {
  if (auto ms = header("grpc-retry-pushback-ms")) {
    if (auto delay = ParsePushback(*ms, /*seconds=*/false)) return delay;
  }
  if (auto seconds = header("retry-after")) return ParsePushback(*seconds, /*seconds=*/true);
  return std::nullopt;
}

std::optional<std::string> Trailer(const grpc::ClientContext& context, const char* name) {
  const auto& trailers = context.GetServerTrailingMetadata();
  auto it = trailers.find(name);
  if (it == trailers.end()) return std::nullopt;
  return std::string(it->second.data(), it->second.size());
}

}  // namespace

std::optional<std::chrono::milliseconds> ParsePushback(std::string_view value, bool seconds) {
  std::size_t digits = value.find_first_not_of("0123456789");
  if (value.empty() || digits != std::string_view::npos) return std::nullopt;
  // Saturating: anything past an hour (however many digits) is an hour.
  int64_t ms = 0;
  int64_t unit = seconds ? 1000 : 1;
  for (char c : value) {
    ms = ms * 10 + (c - '0') * unit;
    if (ms > kMaxPushback.count()) return kMaxPushback;
  }
  return std::clamp(std::chrono::milliseconds(ms), kMinPushback, kMaxPushback);
}

bool Refusal::NeedsPerson() const {
  return reason == "revoked" || reason == "unknown-node" || reason == "trust-domain-mismatch";
}

std::string Refusal::ToString() const {
  if (reason.empty()) return fmt::format("refused ({}): {}", static_cast<int>(code), message);
  return fmt::format("refused ({}): {}", reason, message);
}

Refusal RefusalOfHttp(unsigned status, const std::map<std::string, std::string>& headers,
                      std::string message) {
  auto header = [&](const char* name) -> std::optional<std::string> {
    auto it = headers.find(name);
    if (it == headers.end()) return std::nullopt;
    return it->second;
  };
  Refusal refusal;
  if (auto code = header("grpc-status"); code && Number(*code) && *Number(*code) <= 16) {
    refusal.code = static_cast<grpc::StatusCode>(*Number(*code));
  } else {
    switch (status) {
      case 400:
        refusal.code = grpc::StatusCode::INTERNAL;
        break;
      case 401:
        refusal.code = grpc::StatusCode::UNAUTHENTICATED;
        break;
      case 403:
        refusal.code = grpc::StatusCode::PERMISSION_DENIED;
        break;
      case 404:
        refusal.code = grpc::StatusCode::UNIMPLEMENTED;
        break;
      case 429:
      case 502:
      case 503:
      case 504:
        refusal.code = grpc::StatusCode::UNAVAILABLE;
        break;
      default:
        refusal.code = grpc::StatusCode::UNKNOWN;
    }
  }
  if (refusal.code == grpc::StatusCode::OK) refusal.code = grpc::StatusCode::UNKNOWN;
  refusal.reason = header("x-bc-reason").value_or("");
  refusal.message = header("grpc-message").value_or(std::move(message));
  refusal.pushback = Pushback(header);
  return refusal;
}

Refusal RefusalOf(const grpc::Status& status, const grpc::ClientContext& context) {
  Refusal refusal;
  refusal.code = status.error_code();
  refusal.message = status.error_message();
  refusal.reason = Trailer(context, "x-bc-reason").value_or("");
  refusal.pushback = Pushback([&](const char* name) { return Trailer(context, name); });
  return refusal;
}

}  // namespace bcd::transport
