// Durability observed, not assumed: the real bcd runs under strace, and what it did to its files is
// checked against when the dev gateway received each frame.
//
// - Every command update and event the gateway receives was written to outbox.log and fdatasynced
//   before it left: each fdatasync is made to return 200 ms late (strace's delay_exit), so a frame
//   sent before its sync would arrive before that sync could have returned.
// - Every file replaced in the state dir went write, fsync, rename, fsync of the directory.
// - A command killed (SIGKILL) after it was taken and before it ran is reported INTERRUPTED by the
//   next bcd, and never runs: the outbox's syncs are held back 5 s to keep it there.

#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <sstream>
#include <thread>

#include "daemon/identity/join.h"
#include "gtest/gtest.h"
#include "testing/child_process.h"
#include "testing/dev_gateway.h"
#include "testing/wait.h"
#include "tests/unit/fake_root.h"

namespace bcd {
namespace {

namespace v1 = bettercompute::agent::v1;
using bcd::testing::DevGateway;
using bcd::testing::DevPki;
using bcd::testing::FakeRoot;
using std::chrono::seconds;

constexpr auto kWait = seconds(30);

double WallNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// One system call from strace -ttt -T -y: when it was entered, its name, its first argument's
// path (-y) and, for rename, both paths.
struct Call {
  double at = 0;
  std::string name, path, to;
  int pid = 0;
};

// Every call in the files strace -ff wrote for `prefix`, in time order.
std::vector<Call> ReadTrace(const std::filesystem::path& prefix) {
  static const std::regex kLine(
      R"re(^(\d+\.\d+) (\w+)\((?:\d+<([^>]*)>|"([^"]*)")(?:, "([^"]*)")?.*)re");
  std::vector<Call> calls;
  for (const auto& entry : std::filesystem::directory_iterator(prefix.parent_path())) {
    std::string name = entry.path().filename().string();
    if (name.rfind(prefix.filename().string() + ".", 0) != 0) continue;
    int pid = std::stoi(name.substr(prefix.filename().string().size() + 1));
    std::ifstream in(entry.path());
    for (std::string line; std::getline(in, line);) {
      std::smatch m;
      if (!std::regex_match(line, m, kLine)) continue;
      Call call{std::stod(m[1]), m[2], m[3].matched ? m[3].str() : m[4].str(), m[5], pid};
      calls.push_back(call);
    }
  }
  std::sort(calls.begin(), calls.end(), [](const Call& a, const Call& b) { return a.at < b.at; });
  return calls;
}

// Kills a child still running when the scope ends (a failed assertion on the way): first what it
// runs under strace, if anything, then the child itself. Set `pid` to -1 once it was waited for.
struct Reaped {
  pid_t pid;
  pid_t traced = -1;
  ~Reaped() {
    if (pid <= 0) return;
    if (traced > 0) kill(traced, SIGKILL);
    kill(pid, SIGKILL);
    testing::WaitChild(pid);
  }
};

class Durability : public ::testing::Test {
 protected:
  Durability() : pki_(*DevPki::Create(std::time(nullptr))) {
    gateway_ = *DevGateway::Start(
        pki_, {.on_frame = [this](const std::string&, const v1::AgentFrame& frame) {
          uint64_t seq = frame.has_command_update() ? frame.command_update().seq()
                         : frame.has_event()        ? frame.event().seq()
                                                    : 0;
          if (seq == 0) return;
          std::lock_guard<std::mutex> lock(mu_);
          received_.emplace(seq, WallNow());  // the first arrival of each
        }});
    state_ = dir_.path() / "state";
    config_ = (dir_.path() / "config.toml").string();
    dir_.Write("config.toml", gateway_->ConfigToml(state_) +
                                  "[node]\nreboot_command = [\"/bin/sh\", \"-c\", \"echo ran >> " +
                                  (dir_.path() / "rebooted").string() + "\"]\n");
    Config config = *Config::Load(config_);
    JoinSpec spec{.evidence = gateway_->AddJoinToken("n-1"),
                  .now = [] { return static_cast<int64_t>(std::time(nullptr)); },
                  .sleep = [](seconds) {}};
    EXPECT_TRUE(JoinFleet(config, spec).ok());
  }

  // The process strace started (bcd): signals go to it, and strace ends with it. strace forks
  // short-lived children of its own first (probes of what ptrace can do), so the child is the one
  // that runs the bcd binary, not merely the first one listed.
  static pid_t Traced(pid_t strace) {
    std::filesystem::path bcd = std::filesystem::canonical(BCD_BINARY);
    std::string children =
        "/proc/" + std::to_string(strace) + "/task/" + std::to_string(strace) + "/children";
    pid_t found = -1;
    testing::WaitFor([&] {
      std::ifstream in(children);
      for (pid_t child = 0; in >> child;) {
        std::error_code error;
        auto exe = std::filesystem::read_symlink("/proc/" + std::to_string(child) + "/exe", error);
        if (!error && exe == bcd) found = child;
      }
      return found > 0;
    });
    return found;
  }

  // bcd node under strace; `strace_args` choose what is traced and injected.
  pid_t StartTraced(const std::vector<std::string>& strace_args) {
    // LeakSanitizer cannot run under ptrace (the sanitizer build's bcd would abort at exit): off
    // for the traced bcd only; every other test of that build checks for leaks.
    std::string asan = "ASAN_OPTIONS=";
    if (const char* options = std::getenv("ASAN_OPTIONS")) asan += std::string(options) + ":";
    asan += "detect_leaks=0";
    std::vector<std::string> argv = {
        "strace", "-ff", "-ttt", "-T", "-y", "-E", asan, "-o", (dir_.path() / "trace").string()};
    argv.insert(argv.end(), strace_args.begin(), strace_args.end());
    argv.insert(argv.end(), {BCD_BINARY, "node", "--config", config_});
    return testing::SpawnChild(argv);
  }

  void Push(const v1::ServerFrame& frame) { ASSERT_TRUE(gateway_->Push("n-1", frame)); }

  v1::ServerFrame Command(const std::string& id, const std::string& kind) {
    v1::ServerFrame frame;
    *frame.mutable_command() =
        pki_.SignCommand(DevPki::MakeCommand(id, "n-1", kind, std::time(nullptr)));
    return frame;
  }

  // Waits (bounded) until an update of `id` in `state` has come.
  bool WaitForState(const std::string& id, v1::CommandState state) {
    auto deadline = std::chrono::steady_clock::now() + kWait;
    while (std::chrono::steady_clock::now() < deadline) {
      for (const auto& frame : gateway_->Received("n-1")) {
        if (frame.has_command_update() && frame.command_update().command_id() == id &&
            frame.command_update().state() == state)
          return true;
      }
      gateway_->WaitForReceived("n-1", gateway_->Received("n-1").size() + 1,
                                std::chrono::milliseconds(200));
    }
    return false;
  }

  FakeRoot dir_;
  DevPki pki_;
  std::unique_ptr<DevGateway> gateway_;
  std::filesystem::path state_;
  std::string config_;
  std::mutex mu_;
  std::map<uint64_t, double> received_;  // guarded by mu_: seq -> when the gateway had it
};

TEST_F(Durability, EveryUpdateIsSyncedBeforeItLeavesAndEveryReplacedFileIsSyncedAroundItsRename) {
  constexpr double kDelay = 0.2;  // every fdatasync returns this late
  pid_t node = StartTraced(
      {"-e", "trace=write,fdatasync,fsync,rename", "-e", "inject=fdatasync:delay_exit=200000"});
  ASSERT_GT(node, 0);
  Reaped reaped{node, Traced(node)};
  ASSERT_GT(reaped.traced, 0) << "bcd never started under strace";
  ASSERT_TRUE(gateway_->WaitForWelcomes(1, kWait));
  // Updates and events through the outbox; a spec and a trust bundle replace files.
  for (int i = 0; i < 3; ++i) Push(Command("c-" + std::to_string(i), "inventory.refresh"));
  v1::NodeSpec spec;
  spec.set_node_id("n-1");
  spec.set_generation(1);
  spec.mutable_daemon()->set_log_level("info");
  v1::ServerFrame frame;
  *frame.mutable_desired_state() = pki_.SignSpec(spec);
  Push(frame);
  *frame.mutable_trust() = pki_.SignedBundle(2);
  Push(frame);
  for (int i = 0; i < 3; ++i)
    ASSERT_TRUE(WaitForState("c-" + std::to_string(i), v1::COMMAND_STATE_SUCCEEDED)) << i;
  ASSERT_TRUE(testing::WaitFor([&] {
    bool event = false;
    for (const auto& f : gateway_->Received("n-1")) event |= f.has_event();
    return event;
  })) << "the trust.updated event never came";
  kill(reaped.traced, SIGTERM);
  int status = testing::WaitChild(node);
  reaped.pid = -1;
  ASSERT_EQ(status, 0);

  std::vector<Call> calls = ReadTrace(dir_.path() / "trace");
  std::string outbox = (state_ / "outbox.log").string();
  // The k-th write to outbox.log appends seq k (a fresh outbox; compaction writes elsewhere).
  std::vector<double> appended, synced;
  for (const Call& call : calls) {
    if (call.path != outbox) continue;
    if (call.name == "write") appended.push_back(call.at);
    if (call.name == "fdatasync") synced.push_back(call.at);
  }
  std::map<uint64_t, double> received;
  {
    std::lock_guard<std::mutex> lock(mu_);
    received = received_;
  }
  ASSERT_GE(received.size(), 10u) << "9 updates and an event at least";
  for (const auto& [seq, at] : received) {
    ASSERT_LE(seq, appended.size()) << "seq " << seq << " was never written to " << outbox;
    double written = appended[seq - 1];
    // The first sync of the outbox after the write: the frame may leave once it has returned.
    auto sync = std::find_if(synced.begin(), synced.end(), [&](double s) { return s > written; });
    ASSERT_NE(sync, synced.end()) << "seq " << seq << " was written and never synced";
    EXPECT_GE(at, *sync + kDelay) << "seq " << seq << " left before its fdatasync returned";
  }

  // write, fsync, rename, fsync of the directory, for every file the daemon replaced.
  int renames = 0;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    const Call& rename = calls[i];
    if (rename.name != "rename" || rename.to.rfind(state_.string(), 0) != 0) continue;
    ++renames;
    double last_write = -1, fsync_temp = -1, fsync_dir = -1;
    for (std::size_t j = 0; j < i; ++j) {
      if (calls[j].path != rename.path) continue;
      if (calls[j].name == "write") last_write = calls[j].at;
      if (calls[j].name == "fsync" && calls[j].at > last_write) fsync_temp = calls[j].at;
    }
    for (std::size_t j = i + 1; j < calls.size() && fsync_dir < 0; ++j) {
      if (calls[j].pid == rename.pid && calls[j].name == "fsync" &&
          calls[j].path == std::filesystem::path(rename.to).parent_path().string())
        fsync_dir = calls[j].at;
    }
    EXPECT_GT(last_write, 0) << rename.to << ": nothing written before its rename";
    EXPECT_GT(fsync_temp, last_write) << rename.to << ": not fsynced after its last write";
    EXPECT_GT(fsync_dir, rename.at) << rename.to << ": its directory was not fsynced after";
  }
  EXPECT_GE(renames, 4) << "the logs created, the spec, the trust bundle";
}

TEST_F(Durability, ACommandKilledBeforeItRanIsReportedInterruptedAndNeverRuns) {
  // The outbox's syncs take 5 s: node.reboot is marked running in results.log, its ACCEPTED is
  // being synced, and bcd is killed right then.
  std::string outbox = (state_ / "outbox.log").string();
  pid_t node = StartTraced(
      {"-e", "trace=fdatasync", "-P", outbox, "-e", "inject=fdatasync:delay_enter=5000000"});
  ASSERT_GT(node, 0);
  Reaped traced{node, Traced(node)};
  ASSERT_GT(traced.traced, 0) << "bcd never started under strace";
  ASSERT_TRUE(gateway_->WaitForWelcomes(1, kWait));
  v1::ServerFrame reboot = Command("c-reboot", "node.reboot");
  Push(reboot);
  std::filesystem::path results = state_ / "results.log";
  ASSERT_TRUE(testing::WaitFor([&] {
    std::ifstream in(results, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return bytes.find("Rc-reboot") != std::string::npos;
  })) << "node.reboot was never marked running";
  kill(traced.traced, SIGKILL);
  testing::WaitChild(node);
  traced.pid = -1;
  ASSERT_TRUE(gateway_->WaitForNoSession("n-1", kWait));

  pid_t again = testing::SpawnChild({BCD_BINARY, "node", "--config", config_});
  ASSERT_GT(again, 0);
  Reaped reaped{again};
  ASSERT_TRUE(WaitForState("c-reboot", v1::COMMAND_STATE_FAILED));
  v1::CommandUpdate interrupted;
  for (const auto& frame : gateway_->Received("n-1")) {
    if (frame.has_command_update() && frame.command_update().state() == v1::COMMAND_STATE_FAILED)
      interrupted = frame.command_update();
  }
  EXPECT_EQ(v1::CommandCode_Name(interrupted.code()), "COMMAND_CODE_INTERRUPTED");
  // Delivered again, it is answered from memory: it never runs.
  auto answers = [&] {
    std::vector<v1::CommandUpdate> found;
    for (const auto& frame : gateway_->Received("n-1")) {
      if (frame.has_command_update() && frame.command_update().command_id() == "c-reboot")
        found.push_back(frame.command_update());
    }
    return found;
  };
  std::size_t before = answers().size();
  Push(reboot);
  for (int i = 0; i < 100 && answers().size() == before; ++i) {
    gateway_->WaitForReceived("n-1", gateway_->Received("n-1").size() + 1,
                              std::chrono::milliseconds(200));
  }
  ASSERT_GT(answers().size(), before);
  EXPECT_EQ(v1::CommandCode_Name(answers().back().code()), "COMMAND_CODE_INTERRUPTED");
  kill(again, SIGTERM);
  EXPECT_EQ(testing::WaitChild(again), 0);
  reaped.pid = -1;
  EXPECT_FALSE(std::filesystem::exists(dir_.path() / "rebooted")) << "the reboot command ran";
}

}  // namespace
}  // namespace bcd
