#include "base/net.h"

#include <arpa/inet.h>

#include <charconv>

namespace bcd {

std::optional<std::string> IpBytes(std::string_view text_in) {
  std::string text(text_in);
  unsigned char buffer[16];
  if (inet_pton(AF_INET, text.c_str(), buffer) == 1)
    return std::string(reinterpret_cast<char*>(buffer), 4);
  if (inet_pton(AF_INET6, text.c_str(), buffer) == 1)
    return std::string(reinterpret_cast<char*>(buffer), 16);
  return std::nullopt;
}

bool InCidr(std::string_view block, std::string_view host) {
  std::size_t slash = block.find('/');
  std::optional<std::string> network = IpBytes(block.substr(0, slash));
  std::optional<std::string> address = IpBytes(host);
  if (!network || !address || network->size() != address->size()) return false;
  unsigned bits = static_cast<unsigned>(network->size() * 8);
  if (slash != std::string_view::npos) {
    std::string_view prefix = block.substr(slash + 1);
    auto [end, ec] = std::from_chars(prefix.data(), prefix.data() + prefix.size(), bits);
    if (prefix.empty() || ec != std::errc() || end != prefix.data() + prefix.size() ||
        bits > network->size() * 8) {
      return false;
    }
  }
  for (unsigned i = 0; i < bits; ++i) {
    unsigned char mask = static_cast<unsigned char>(0x80u >> (i % 8));
    if (((*network)[i / 8] & mask) != ((*address)[i / 8] & mask)) return false;
  }
  return true;
}

std::optional<uint16_t> ParsePort(std::string_view text) {
  unsigned value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value == 0 ||
      value > 65535) {
    return std::nullopt;
  }
  return static_cast<uint16_t>(value);
}

}  // namespace bcd
