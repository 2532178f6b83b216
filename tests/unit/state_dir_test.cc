// The state directory is checked, never taken over: created 0700 when absent, refused (unchanged)
// when it is looser, another user's or not a directory; one daemon holds its lock; `bcd status`
// reads it without changing anything.

#include <sys/stat.h>
#include <unistd.h>

#include "base/version.h"
#include "daemon/identity/identity.h"
#include "fmt/format.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/absl_compat.h"
#include "tests/unit/fake_root.h"

namespace bcd {
namespace {

using bcd::testing::FakeRoot;

std::string Message(const absl::Status& status) { return std::string(ToStd(status.message())); }

mode_t ModeOf(const std::filesystem::path& path) {
  struct stat st {};
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

TEST(StateDir, CreatesAMissingDirectory0700WithItsParents) {
  FakeRoot dir;
  std::filesystem::path state = dir.path() / "var/lib/bcd";
  mode_t before = umask(022);
  absl::StatusOr<StateDir> opened = StateDir::Open(state);
  umask(before);
  ASSERT_TRUE(opened.ok()) << Message(opened.status());
  EXPECT_EQ(ModeOf(state), 0700u);
  EXPECT_EQ(ModeOf(state.parent_path()), 0755u);
  ASSERT_TRUE(StateDir::Open(state).ok()) << "and opens it again";
}

TEST(StateDir, RefusesALooserDirectoryAndLeavesItAsItWas) {
  FakeRoot dir;
  for (mode_t mode : {0755, 0750, 0701, 01777}) {
    std::filesystem::path state = dir.path() / fmt::format("state-{:o}", mode);
    ASSERT_EQ(mkdir(state.c_str(), 0700), 0);
    ASSERT_EQ(chmod(state.c_str(), mode), 0);
    absl::StatusOr<StateDir> opened = StateDir::Open(state);
    EXPECT_EQ(opened.status().code(), absl::StatusCode::kPermissionDenied)
        << fmt::format("{:o}", mode);
    EXPECT_EQ(Message(opened.status()),
              fmt::format("state dir {} has mode {:04o}: group and others must have no access "
                          "(chmod 700 {}), or point state_dir at a directory of its own",
                          state.string(), mode, state.string()));
    EXPECT_EQ(ModeOf(state), mode) << "not changed (a sticky bit kept too)";
  }
}

TEST(StateDir, RefusesWhatIsNotADirectory) {
  FakeRoot dir;
  dir.Write("file", "x");
  EXPECT_EQ(StateDir::Open(dir.path() / "file").status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_EQ(mkdir((dir.path() / "real").c_str(), 0700), 0);
  dir.Link("link", (dir.path() / "real").string());
  absl::StatusOr<StateDir> link = StateDir::Open(dir.path() / "link");
  EXPECT_EQ(Message(link.status()),
            fmt::format("state dir {} is not a directory (a symbolic link): point state_dir at a "
                        "directory of its own",
                        (dir.path() / "link").string()));
}

TEST(StateDir, RefusesADirectoryOfAnotherUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a directory to another user";
  FakeRoot dir;
  std::filesystem::path state = dir.path() / "state";
  ASSERT_EQ(mkdir(state.c_str(), 0700), 0);
  ASSERT_EQ(chown(state.c_str(), 65534, 65534), 0);
  absl::StatusOr<StateDir> opened = StateDir::Open(state);
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Message(opened.status()),
            fmt::format("state dir {} belongs to uid 65534, and bcd runs as uid 0: run bcd as its "
                        "owner, or give bcd a directory of its own (chown 0 {})",
                        state.string(), state.string()));
}

TEST(StateDir, StatusReadsWithoutCreatingOrChangingAnything) {
  FakeRoot dir;
  std::filesystem::path missing = dir.path() / "missing";
  nlohmann::json status = *StateDirStatus(missing, 0);
  EXPECT_EQ(status["node"]["joined"], false);
  EXPECT_EQ(StatusText(status), fmt::format("version: {}\nnode: not joined (no identity in {})\n"
                                            "session: not running (no daemon answers on ?)\n",
                                            Version(), missing.string()));
  EXPECT_FALSE(std::filesystem::exists(missing));
  // `state_dir = "/"` by mistake: status must not make it 0700 (here a stand-in that is 0755).
  std::filesystem::path open = dir.path() / "open";
  ASSERT_EQ(mkdir(open.c_str(), 0755), 0);
  ASSERT_EQ(chmod(open.c_str(), 01755), 0);
  EXPECT_TRUE(StateDirStatus(open, 0).ok());
  EXPECT_EQ(ModeOf(open), 01755u);
}

TEST(StateDir, OneLockHolderAtATime) {
  FakeRoot dir;
  StateDir state = *StateDir::Open(dir.path() / "state");
  {
    absl::StatusOr<StateDirLock> first = state.Lock();
    ASSERT_TRUE(first.ok()) << Message(first.status());
    absl::StatusOr<StateDirLock> second = StateDir::Open(dir.path() / "state")->Lock();
    EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(Message(second.status()),
              fmt::format("another bcd is already running on {}", (dir.path() / "state").string()));
  }
  EXPECT_TRUE(state.Lock().ok()) << "released with its holder";
}

}  // namespace
}  // namespace bcd
