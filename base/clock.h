#pragma once

// The one clock: unix seconds, injected. Product code asks a UnixClock it was handed (the app
// passes the system clock, tests a value they step); only app/main.cc reads the real time.

#include <cstdint>
#include <functional>

namespace bcd {

using UnixClock = std::function<int64_t()>;

}  // namespace bcd
