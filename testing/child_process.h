#pragma once

// Child processes for the dev stack, its tools and tests: started in the background with default
// signal handling (whatever the parent blocks), waited for by pid; and a free port to give them.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace bcd::testing {

// What a shell command did: its exit status (128 when a signal ended it) and its stdout and stderr.
struct Ran {
  int status = 0;
  std::string out;
};
// Runs `command` with sh -c, stderr into the same output.
Ran RunShell(const std::string& command);

// Starts argv (argv[0] looked up on PATH); -1 when it cannot start.
pid_t SpawnChild(const std::vector<std::string>& argv);
// Waits for the child: its exit status, or 128 + the signal that ended it. A child still running
// after `limit` is killed (SIGKILL), said so on stderr, and answered kStillRunning: a test that
// waits for a child can fail, never hang.
constexpr int kStillRunning = -2;
int WaitChild(pid_t pid, std::chrono::seconds limit = std::chrono::seconds(180));
// A free loopback port (bound, read, released) for a server a child or a restart will listen on.
int FreeLoopbackPort();
// A listening TCP socket on 127.0.0.1 with a port of the kernel's choice (written to `port`).
int ListenOnLoopback(uint16_t* port);
// A TCP connection to 127.0.0.1:`port`; -1 when nothing accepts there.
int ConnectLoopback(uint16_t port);
// Waits up to 10 s until something accepts connections on 127.0.0.1:`port`.
bool WaitForLoopbackPort(uint16_t port);
// Sends `request` over TCP from `source` (an address of this machine, e.g. a loopback alias) to
// 127.0.0.1:`port` and returns everything the server wrote before closing ("" when it would not
// connect). For servers that answer by source address.
std::string SendFrom(const std::string& source, int port, const std::string& request);
// Sends all of `data` on the socket `fd` (no SIGPIPE; EINTR retried); false when the peer is gone.
bool SendAll(int fd, std::string_view data);
// Reads `fd` until the peer closes, or until more than `max` bytes have come.
std::string ReadToEnd(int fd, std::size_t max = std::size_t{1} << 30);
// Writes `request` to the connected socket `fd`, half-closes it, reads everything until the peer
// closes, and closes `fd`.
std::string Converse(int fd, const std::string& request);

}  // namespace bcd::testing
