#pragma once

// Redial delays: exponential backoff with full jitter (a uniform draw in [0, min(cap, base *
// 2^n)]), so a fleet that lost its gateway at once does not come back at once.

#include <chrono>
#include <functional>

namespace bcd {

class Backoff {
 public:
  // `uniform01` draws from [0, 1); injected so tests and the storm benchmark control it.
  explicit Backoff(std::function<double()> uniform01,
                   std::chrono::milliseconds base = std::chrono::seconds(1),
                   std::chrono::milliseconds cap = std::chrono::seconds(60));
  std::chrono::milliseconds Next();
  // The delay for a server's pushback (already clamped to its bounds): at least what it asked, plus
  // up to a quarter more, so nodes told the same delay do not all come back in the same second.
  std::chrono::milliseconds After(std::chrono::milliseconds pushback);
  void Reset() { attempt_ = 0; }

 private:
  std::function<double()> uniform01_;
  std::chrono::milliseconds base_, cap_;
  int attempt_ = 0;
};

}  // namespace bcd
