#pragma once

// Waiting in tests for what can only be seen by looking again (a file, a process, a counter, the
// frames a gateway received): one bounded poll instead of a sleep loop in every test. Where the
// code under test offers a condition to wait on, wait on that instead.

#include <chrono>
#include <functional>

namespace bcd::testing {

// Checks `done` until it holds or `limit` has passed, every `step` in between; whether it held.
// `done` is checked once more at the deadline, so a limit of zero is one look.
bool WaitFor(const std::function<bool()>& done,
             std::chrono::milliseconds limit = std::chrono::seconds(30),
             std::chrono::milliseconds step = std::chrono::milliseconds(10));

}  // namespace bcd::testing
