#include "base/net.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>

#include "fmt/format.h"

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

absl::StatusOr<Listening> ListenTcp(std::string_view what, const std::string& host, uint16_t port,
                                    int backlog) {
  sockaddr_storage storage{};
  socklen_t length = 0;
  if (auto* v4 = reinterpret_cast<sockaddr_in*>(&storage);
      inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    length = sizeof(sockaddr_in);
  } else if (auto* v6 = reinterpret_cast<sockaddr_in6*>(&storage);
             inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    length = sizeof(sockaddr_in6);
  } else {
    return absl::InvalidArgumentError(fmt::format("{}: {} is not an IP address", what, host));
  }
  Listening listening{.fd = Fd(socket(storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0))};
  int on = 1;
  if (listening.fd) setsockopt(listening.fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  if (!listening.fd ||
      bind(listening.fd.get(), reinterpret_cast<sockaddr*>(&storage), length) != 0 ||
      listen(listening.fd.get(), backlog) != 0) {
    return absl::UnavailableError(
        fmt::format("{}: cannot listen on {}:{}: {}", what, host, port, std::strerror(errno)));
  }
  getsockname(listening.fd.get(), reinterpret_cast<sockaddr*>(&storage), &length);
  listening.port =
      ntohs(storage.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&storage)->sin_port
                                         : reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port);
  return listening;
}

}  // namespace bcd
