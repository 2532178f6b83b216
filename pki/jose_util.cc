#include "pki/jose_util.h"

namespace bcd::pki {

std::optional<nlohmann::json> ParseJsonObject(std::string_view text, std::size_t max_bytes) {
  if (text.size() > max_bytes) return std::nullopt;
  bool too_deep = false;
  nlohmann::json::parser_callback_t limit_depth = [&](int depth, nlohmann::json::parse_event_t,
                                                      nlohmann::json&) {
    if (depth > 16) too_deep = true;
    return !too_deep;
  };
  nlohmann::json value = nlohmann::json::parse(text.begin(), text.end(), limit_depth,
                                               /*allow_exceptions=*/false);
  if (too_deep || value.is_discarded() || !value.is_object()) return std::nullopt;
  return value;
}

std::optional<std::string> StringMember(const nlohmann::json& object, std::string_view name) {
  if (!object.is_object()) return std::nullopt;
  auto it = object.find(name);
  if (it == object.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

std::vector<std::string_view> SplitCompact(std::string_view compact) {
  std::vector<std::string_view> parts;
  while (true) {
    std::size_t dot = compact.find('.');
    parts.push_back(compact.substr(0, dot));
    if (dot == std::string_view::npos) break;
    compact.remove_prefix(dot + 1);
  }
  return parts;
}

}  // namespace bcd::pki
