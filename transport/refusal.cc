#include "transport/refusal.h"

#include <charconv>

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

std::optional<std::string> Trailer(const grpc::ClientContext& context, const char* name) {
  const auto& trailers = context.GetServerTrailingMetadata();
  auto it = trailers.find(name);
  if (it == trailers.end()) return std::nullopt;
  return std::string(it->second.data(), it->second.size());
}

}  // namespace

bool Refusal::NeedsPerson() const {
  return reason == "revoked" || reason == "unknown-node" || reason == "trust-domain-mismatch";
}

std::string Refusal::ToString() const {
  if (reason.empty()) return fmt::format("refused ({}): {}", static_cast<int>(code), message);
  return fmt::format("refused ({}): {}", reason, message);
}

Refusal RefusalOf(const grpc::Status& status, const grpc::ClientContext& context) {
  Refusal refusal;
  refusal.code = status.error_code();
  refusal.message = status.error_message();
  refusal.reason = Trailer(context, "x-bc-reason").value_or("");
  if (auto ms = Trailer(context, "grpc-retry-pushback-ms"); ms && Number(*ms)) {
    refusal.pushback = std::chrono::milliseconds(*Number(*ms));
  } else if (auto seconds = Trailer(context, "retry-after"); seconds && Number(*seconds)) {
    refusal.pushback = std::chrono::seconds(*Number(*seconds));
  }
  return refusal;
}

}  // namespace bcd::transport
