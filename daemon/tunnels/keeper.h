#pragma once

// How a shell or exec tunnel's command runs: as the configured account, below a keeper process
// that is a child subreaper, so that everything the command starts (a setsid'd or double-forked
// process included) ends with the tunnel.

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace bcd::tunnels {

// Who a shell or exec runs as, looked up before fork (nothing after fork may allocate).
struct Account {
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;
  std::string name, home, shell;
  bool switch_user = false;
};

// The account [tunnels] user names ("" = bcd's own). A user other than bcd's own needs root.
absl::StatusOr<Account> LookUp(const std::string& user);

// argv and envp as the child needs them, built before fork.
struct ChildArgs {
  std::vector<std::string> argv_storage, env_storage;
  std::vector<char*> argv, envp;
  std::string program;
  void Finish();
};

// A login shell of `account` (`login`), or `argv` run as it; HOME, USER, a fixed PATH, TERM.
ChildArgs MakeArgs(const Account& account, std::vector<std::string> argv, bool login);

// In the child of bcd's fork, with the command's standard fds already on 0..2: becomes a
// subreaper, closes every other fd bcd had (another tunnel's stdin pipe among them), starts the
// command and keeps it: on SIGTERM from bcd (or bcd's death), or once the command exits, it kills
// every process below it and exits with the command's exit code (128 + the signal when one ended
// it). `own_group`: the command leads a process group of its own (exec). Never returns.
[[noreturn]] void StartKept(const Account& account, const ChildArgs& args, bool own_group);

// A wait status as an exit code: the code, or 128 + the signal.
int ExitCode(int status);

}  // namespace bcd::tunnels
