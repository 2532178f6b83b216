#include "base/net.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cctype>
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

bool IsIpv4(const std::string& text) {
  in_addr addr{};
  return inet_pton(AF_INET, text.c_str(), &addr) == 1;
}

bool IsIpv6(const std::string& text) {
  in6_addr addr{};
  return inet_pton(AF_INET6, text.c_str(), &addr) == 1;
}

// RFC 1123 host name: dot-separated labels of letters, digits and inner hyphens.
bool IsDnsName(std::string_view name) {
  if (name.empty() || name.size() > 253) return false;
  std::size_t start = 0;
  while (start <= name.size()) {
    std::size_t dot = name.find('.', start);
    std::string_view label =
        name.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') {
      return false;
    }
    for (char c : label) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') return false;
    }
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  // An all-numeric last label would read as a (bad) IPv4 address.
  std::string_view last =
      name.substr(name.rfind('.') == std::string_view::npos ? 0 : name.rfind('.') + 1);
  return !std::all_of(last.begin(), last.end(),
                      [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
}

// Splits "host:port" or "[v6]:port" into its parts; nullopt when malformed.
std::optional<std::pair<std::string, std::string_view>> SplitHostPort(std::string_view text) {
  if (!text.empty() && text.front() == '[') {
    std::size_t close = text.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    std::string host(text.substr(1, close - 1));
    std::string_view rest = text.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') return std::nullopt;
    return std::pair{host, rest.empty() ? rest : rest.substr(1)};
  }
  std::size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) return std::pair{std::string(text), std::string_view()};
  return std::pair{std::string(text.substr(0, colon)), text.substr(colon + 1)};
}

}  // namespace bcd
