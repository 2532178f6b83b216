#include "base/backoff.h"

#include <algorithm>

namespace bcd {

Backoff::Backoff(std::function<double()> uniform01, std::chrono::milliseconds base,
                 std::chrono::milliseconds cap)
    : uniform01_(std::move(uniform01)), base_(base), cap_(cap) {}

std::chrono::milliseconds Backoff::Next() {
  int shift = std::min(attempt_, 20);
  auto ceiling = std::min<int64_t>(cap_.count(), base_.count() << shift);
  ++attempt_;
  return std::chrono::milliseconds(
      static_cast<int64_t>(uniform01_() * static_cast<double>(ceiling)));
}

std::chrono::milliseconds Backoff::After(std::chrono::milliseconds pushback) {
  return pushback + std::chrono::milliseconds(static_cast<int64_t>(
                        uniform01_() * static_cast<double>(pushback.count()) / 4));
}

}  // namespace bcd
