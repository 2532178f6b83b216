// bcd-soak: commands through crashes of either side.
//
//   bcd-soak [--commands N] [--reboots R] [--seconds S] [--min-kills K] [--seed X] [--bcd PATH]
//            [--keep]
//
// A control plane (the dev gateway in a child process, which records every update and event in its
// own fsynced log before it acks, and redelivers every command without a terminal result on each
// new session) sends N logs.collect commands (idempotent) and R node.reboot commands (not
// idempotent) to a `bcd node` (a real process), and a newer trust bundle every second. For at
// least S seconds, and until each side was killed K times, the driver SIGKILLs the gateway or bcd
// at random moments (from the seed) and restarts it; then it lets the run finish. The side effects:
// a logs.collect run appends its id and bcd's pid (from a journalctl script first on PATH), a
// reboot appends the command id and bcd's pid (the reboot command is a script). Afterwards, from
// the gateway's log, the side effects and bcd's state dir:
//   - every command id has exactly one terminal result: logs.collect SUCCEEDED, node.reboot
//     SUCCEEDED or FAILED/INTERRUPTED (all terminal updates for it agree);
//   - no command ran twice: a logs.collect that a kill interrupted may run again in the next bcd
//     (a new pid) but never twice in one bcd; a node.reboot never runs twice, in any bcd, and an
//     INTERRUPTED one never ran;
//   - every event was delivered once: one trust.updated per bundle version bcd took;
//   - every sequence number bcd gave arrived (1 to the highest bcd gave, no lost tail), a resent
//     one never changed, and bcd's outbox is empty at the end.
// Prints the figures, the line that replays the run's kill schedule, and exits 1 on any
// violation.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/files.h"
#include "daemon/delivery/outbox.h"
#include "daemon/delivery/record_log.h"
#include "proto/kinds.h"
#include "testing/child_process.h"
#include "testing/dev_gateway.h"
#include "testing/upload_sink.h"

namespace {

namespace v1 = bettercompute::agent::v1;
using bcd::testing::DevGateway;
using bcd::testing::DevPki;
using Clock = std::chrono::steady_clock;

constexpr char kNode[] = "soak-node";

struct Options {
  int commands = 2000;
  int reboots = 100;
  int seconds = 60;
  int min_kills = 5;  // of each side
  uint64_t seed = 0;
  std::string bcd = BCD_BINARY;
  bool keep = false;
  int64_t issued_at = 0;  // one time for every command, so a redelivery is byte for byte the same
};

std::string CommandId(int i) { return "soak-" + std::to_string(i); }
std::string RebootId(int i) { return "reboot-" + std::to_string(i); }

uint64_t SeqOf(const v1::AgentFrame& frame) {
  return frame.has_event()            ? frame.event().seq()
         : frame.has_command_update() ? frame.command_update().seq()
                                      : 0;
}

// The gateway process: never returns.
[[noreturn]] void GatewayRole(const DevPki& pki, int port, const std::filesystem::path& dir,
                              const Options& options, const std::string& upload_url, int ready_fd,
                              bool first) {
  std::mutex mu;
  std::vector<std::string> records;
  absl::StatusOr<bcd::RecordLog> db = bcd::RecordLog::Open(dir / "gateway.db", &records);
  if (!db.ok()) {
    std::fprintf(stderr, "soak gateway: %s\n", std::string(db.status().message()).c_str());
    _exit(3);
  }
  std::set<std::string> terminal;  // guarded by mu
  std::vector<std::string> done;   // guarded by mu: ids as their first terminal result came
  uint64_t max_seq = 0;            // guarded by mu
  auto finished = [&](const v1::AgentFrame& frame) {
    if (frame.has_command_update() && bcd::proto::IsTerminal(frame.command_update().state()) &&
        terminal.insert(frame.command_update().command_id()).second)
      done.push_back(frame.command_update().command_id());
  };
  for (const std::string& record : records) {
    v1::AgentFrame frame;
    frame.ParseFromString(record);
    max_seq = std::max(max_seq, SeqOf(frame));
    finished(frame);
  }
  bcd::testing::DevGatewayOptions gateway_options;
  gateway_options.listen = "127.0.0.1:" + std::to_string(port);
  gateway_options.on_frame = [&](const std::string&, const v1::AgentFrame& frame) {
    if (SeqOf(frame) == 0) return;  // status, inventory, spec acks: not delivery
    std::lock_guard<std::mutex> lock(mu);
    if (absl::Status s = db->Append(frame.SerializeAsString()); !s.ok()) _exit(4);
    max_seq = std::max(max_seq, SeqOf(frame));
    finished(frame);
  };
  absl::StatusOr<std::unique_ptr<DevGateway>> gateway = absl::UnavailableError("not started");
  for (int attempt = 0; attempt < 100 && !gateway.ok(); ++attempt) {
    gateway = DevGateway::Start(pki, gateway_options);
    if (!gateway.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!gateway.ok()) {
    std::fprintf(stderr, "soak gateway: %s\n", std::string(gateway.status().message()).c_str());
    _exit(3);
  }
  std::string hello = first ? (*gateway)->AddJoinToken(kNode) + "\n" : "ready\n";
  (void)!write(ready_fd, hello.data(), hello.size());
  close(ready_fd);

  // Push every command without a terminal result, a window at a time; on a new session, again,
  // with the same bytes (ECDSA signatures differ each time; the body, which dedup compares, not).
  std::size_t sessions = 0;
  std::set<std::string> pushed;  // this session
  auto last_progress = Clock::now();
  int64_t last_bundle = 0;
  // Every command id, in the order they go: a node.reboot after every tenth logs.collect.
  std::vector<std::string> ids;
  for (int i = 0, r = 0; i < options.commands || r < options.reboots; ++i) {
    if (i < options.commands) ids.push_back(CommandId(i));
    if ((i % 10 == 9 || i >= options.commands) && r < options.reboots) ids.push_back(RebootId(r++));
  }
  while (true) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::vector<std::string> due;
    std::size_t in_flight = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (Clock::now() - last_progress > std::chrono::milliseconds(100)) {
        last_progress = Clock::now();
        (void)bcd::AtomicWriteFile(dir / "progress",
                                   std::to_string(terminal.size()) + " " + std::to_string(max_seq),
                                   0600);
      }
      std::size_t now_sessions = (*gateway)->SessionNodes().size();
      if (now_sessions != sessions) {
        sessions = now_sessions;
        pushed.clear();
        // At-least-once delivery: the last finished commands go again on a new session (as a
        // control plane does that was not sure they arrived); bcd must answer them from memory.
        for (std::size_t i = done.size() > 16 ? done.size() - 16 : 0; i < done.size(); ++i)
          due.push_back(done[i]);
      }
      for (const std::string& id : pushed) in_flight += !terminal.contains(id);
      for (const std::string& id : ids) {
        if (in_flight + due.size() >= 64) break;
        if (!terminal.contains(id) && !pushed.contains(id)) due.push_back(id);
      }
    }
    // A newer trust bundle every second: each version bcd takes makes one trust.updated event.
    int64_t now = std::time(nullptr);
    if (now != last_bundle) {
      last_bundle = now;
      v1::ServerFrame frame;
      *frame.mutable_trust() = pki.SignedBundle(static_cast<uint64_t>(now - options.issued_at + 2));
      (void)(*gateway)->Push(kNode, frame);
    }
    for (const std::string& id : due) {
      v1::Command command;
      command.set_command_id(id);
      command.set_node_id(kNode);
      if (id.rfind("reboot-", 0) == 0) {
        v1::NodeRebootPayload payload;
        payload.set_reason("soak");
        command.set_kind("node.reboot");
        command.set_payload(payload.SerializeAsString());
      } else {
        v1::LogsCollectPayload payload;
        payload.set_upload_url(upload_url + "/" + id);
        payload.add_journal_units(id + ".service");
        command.set_kind("logs.collect");
        command.set_payload(payload.SerializeAsString());
      }
      command.set_issued_at(static_cast<uint64_t>(options.issued_at));
      command.set_expires_at(static_cast<uint64_t>(options.issued_at) + 3600);
      v1::ServerFrame frame;
      *frame.mutable_command() = pki.SignCommand(command);
      if (!(*gateway)->Push(kNode, frame)) break;  // no session now
      pushed.insert(id);
    }
  }
}

pid_t StartGateway(const DevPki& pki, int port, const std::filesystem::path& dir,
                   const Options& options, const std::string& upload_url, bool first,
                   std::string* token) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    GatewayRole(pki, port, dir, options, upload_url, fds[1], first);
  }
  close(fds[1]);
  std::string line;
  char c;
  while (read(fds[0], &c, 1) == 1 && c != '\n') line += c;
  close(fds[0]);
  if (token != nullptr) *token = line;
  return pid;
}

pid_t StartNode(const Options& options, const std::filesystem::path& dir) {
  return bcd::testing::SpawnChild({"/bin/sh", "-c",
                                   "exec " + options.bcd + " node --config " +
                                       (dir / "config.toml").string() + " 2>>" +
                                       (dir / "node.log").string()});
}

std::pair<std::size_t, uint64_t> Progress(const std::filesystem::path& dir) {
  std::ifstream in(dir / "progress");
  std::size_t done = 0;
  uint64_t seq = 0;
  in >> done >> seq;
  return {done, seq};
}

int Usage() {
  std::fprintf(stderr,
               "usage: bcd-soak [--commands N] [--reboots R] [--seconds S] [--min-kills K] "
               "[--seed X] [--bcd PATH] [--keep]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  options.seed = static_cast<uint64_t>(std::time(nullptr));
  options.issued_at = std::time(nullptr);
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--keep") {
      options.keep = true;
      continue;
    }
    if (i + 1 >= argc) return Usage();
    std::string value = argv[++i];
    if (arg == "--commands")
      options.commands = std::atoi(value.c_str());
    else if (arg == "--reboots")
      options.reboots = std::atoi(value.c_str());
    else if (arg == "--min-kills")
      options.min_kills = std::atoi(value.c_str());
    else if (arg == "--seconds")
      options.seconds = std::atoi(value.c_str());
    else if (arg == "--seed")
      options.seed = std::strtoull(value.c_str(), nullptr, 10);
    else if (arg == "--bcd")
      options.bcd = value;
    else
      return Usage();
  }
  std::string pattern = "/tmp/bcd-soak-XXXXXX";
  std::filesystem::path dir = mkdtemp(pattern.data());
  std::printf(
      "bcd-soak: %d logs.collect and %d node.reboot commands, at least %d s of kills and %d of "
      "each side, seed %llu, files in %s\n",
      options.commands, options.reboots, options.seconds, options.min_kills,
      static_cast<unsigned long long>(options.seed), dir.c_str());
  std::fflush(stdout);
  // The side effect: the journalctl bcd runs for the command's unit appends its id.
  std::filesystem::create_directories(dir / "bin");
  std::ofstream(dir / "bin" / "journalctl")
      << "#!/bin/sh\ncase \"$5\" in soak-*) echo \"$5 $PPID\" >> " << (dir / "effects").string()
      << ";; esac\necho \"journal of $5\"\n";
  std::filesystem::permissions(dir / "bin" / "journalctl", std::filesystem::perms::owner_all);
  setenv("PATH", ((dir / "bin").string() + ":" + std::getenv("PATH")).c_str(), 1);

  // Everything that forks does so before any thread exists in this process.
  absl::StatusOr<DevPki> pki = DevPki::Create(std::time(nullptr));
  if (!pki.ok())
    return std::fprintf(stderr, "bcd-soak: %s\n", std::string(pki.status().message()).c_str()), 1;
  int sink_fds[2];
  if (pipe(sink_fds) != 0) return 1;
  pid_t sink = fork();
  if (sink == 0) {
    close(sink_fds[0]);
    bcd::testing::UploadSink upload_sink;
    std::string port = std::to_string(upload_sink.port()) + "\n";
    (void)!write(sink_fds[1], port.data(), port.size());
    close(sink_fds[1]);
    while (true) pause();
  }
  close(sink_fds[1]);
  std::string sink_port;
  for (char c; read(sink_fds[0], &c, 1) == 1 && c != '\n';) sink_port += c;
  close(sink_fds[0]);
  std::string upload_url = "http://127.0.0.1:" + sink_port + "/bucket";

  int port = bcd::testing::FreeLoopbackPort();
  std::string token;
  pid_t gateway = StartGateway(*pki, port, dir, options, upload_url, true, &token);
  std::ofstream(dir / "config.toml")
      << bcd::testing::DevConfigToml(port, *pki, dir / "state")
      << "[node]\nreboot_command = [\"/bin/sh\", \"-c\", \"echo $BCD_COMMAND_ID $PPID >> "
      << (dir / "reboots").string() << "\"]\n";
  int joined = bcd::testing::WaitChild(bcd::testing::SpawnChild(
      {options.bcd, "join", "--config", (dir / "config.toml").string(), "--token", token}));
  if (joined != 0) return std::fprintf(stderr, "bcd-soak: bcd join exited %d\n", joined), 1;
  pid_t node = StartNode(options, dir);

  std::mt19937_64 random(options.seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(random); };
  int gateway_kills = 0, node_kills = 0;
  auto start = Clock::now();
  auto kills_end = start + std::chrono::seconds(options.seconds);
  std::size_t all = static_cast<std::size_t>(options.commands + options.reboots);
  auto kills_cap = kills_end + std::chrono::seconds(120);
  // Kill until S seconds are over and each side was killed K times (while commands remain, and
  // after: the outbox and sessions still go through restarts).
  while (Clock::now() < kills_cap &&
         (Clock::now() < kills_end || gateway_kills < options.min_kills ||
          node_kills < options.min_kills)) {
    if (Clock::now() >= kills_end && Progress(dir).first >= all &&
        gateway_kills >= options.min_kills && node_kills >= options.min_kills)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(pick(200, 1500)));
    // A side behind its K kills goes first once the time is up.
    bool gateway_turn = pick(0, 1) == 0;
    if (Clock::now() >= kills_end && gateway_kills < options.min_kills) gateway_turn = true;
    if (Clock::now() >= kills_end && node_kills < options.min_kills &&
        gateway_kills >= options.min_kills)
      gateway_turn = false;
    if (gateway_turn) {
      kill(gateway, SIGKILL);
      bcd::testing::WaitChild(gateway);
      ++gateway_kills;
      std::this_thread::sleep_for(std::chrono::milliseconds(pick(50, 500)));
      gateway = StartGateway(*pki, port, dir, options, upload_url, false, nullptr);
    } else {
      kill(node, SIGKILL);
      bcd::testing::WaitChild(node);
      ++node_kills;
      std::this_thread::sleep_for(std::chrono::milliseconds(pick(50, 500)));
      node = StartNode(options, dir);
    }
  }
  // Calm: let every command finish and the outbox drain.
  auto calm_end = Clock::now() + std::chrono::seconds(120);
  while (Clock::now() < calm_end && Progress(dir).first < all) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::this_thread::sleep_for(std::chrono::seconds(2));
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  kill(node, SIGTERM);
  int node_exit = bcd::testing::WaitChild(node);
  kill(gateway, SIGKILL);
  bcd::testing::WaitChild(gateway);
  kill(sink, SIGKILL);
  bcd::testing::WaitChild(sink);

  // The verdict, from the gateway's log, the side effects and bcd's state dir.
  std::vector<std::string> records;
  absl::StatusOr<bcd::RecordLog> db = bcd::RecordLog::Open(dir / "gateway.db", &records);
  if (!db.ok())
    return std::fprintf(stderr, "bcd-soak: %s\n", std::string(db.status().message()).c_str()), 1;
  std::vector<std::string> violations;
  std::map<uint64_t, std::string> by_seq;
  std::size_t resent = 0;
  std::map<std::string, std::set<std::string>> results;  // id -> distinct terminal results
  std::map<std::string, std::string> final_state;        // id -> STATE[/CODE]
  std::map<std::string, int> states, events;
  std::map<std::string, int> bundle_events;  // trust.updated per version
  for (const std::string& record : records) {
    v1::AgentFrame frame;
    frame.ParseFromString(record);
    uint64_t seq = SeqOf(frame);
    if (auto [it, fresh] = by_seq.emplace(seq, record); !fresh) {
      ++resent;
      if (it->second != record)
        violations.push_back("seq " + std::to_string(seq) +
                             " arrived twice with different content");
      continue;
    }
    if (frame.has_event()) {
      ++events[frame.event().kind()];
      if (frame.event().kind() == "trust.updated")
        ++bundle_events[frame.event().attributes().at("version")];
    }
    if (!frame.has_command_update() || !bcd::proto::IsTerminal(frame.command_update().state()))
      continue;
    v1::CommandUpdate update = frame.command_update();
    update.clear_seq();
    update.clear_time_ms();
    results[update.command_id()].insert(update.SerializeAsString());
    std::string state = v1::CommandState_Name(update.state());
    if (update.code() != v1::COMMAND_CODE_UNSPECIFIED)
      state += "/" + v1::CommandCode_Name(update.code());
    final_state[update.command_id()] = state;
    ++states[state];
  }
  uint64_t max_seq = by_seq.empty() ? 0 : by_seq.rbegin()->first;
  for (uint64_t seq = 1; seq <= max_seq; ++seq) {
    if (!by_seq.contains(seq))
      violations.push_back("seq " + std::to_string(seq) + " never arrived");
  }
  // An event once: each bundle version bcd took made one trust.updated, under one seq.
  for (const auto& [version, count] : bundle_events) {
    if (count != 1)
      violations.push_back("trust.updated for version " + version + " arrived under " +
                           std::to_string(count) + " sequence numbers");
  }
  // No lost tail, nothing left behind: bcd gave no seq the gateway lacks, and acknowledged all.
  absl::StatusOr<bcd::Outbox> outbox = bcd::Outbox::Open(dir / "state");
  if (!outbox.ok()) {
    violations.push_back("bcd's outbox: " + std::string(outbox.status().message()));
  } else {
    if (outbox->next_seq() - 1 != max_seq)
      violations.push_back("bcd gave sequence numbers up to " +
                           std::to_string(outbox->next_seq() - 1) + ", the gateway has up to " +
                           std::to_string(max_seq));
    if (!outbox->pending().empty())
      violations.push_back(std::to_string(outbox->pending().size()) +
                           " entries still wait in bcd's outbox");
  }
  // Side effects, one line per run: "id pid".
  auto runs = [&](const std::string& file) {
    std::map<std::string, std::vector<std::string>> by_id;
    std::ifstream in(dir / file);
    for (std::string line; std::getline(in, line);) {
      std::string id = line.substr(0, line.find(' '));
      if (std::size_t dot = id.find(".service"); dot != std::string::npos) id = id.substr(0, dot);
      by_id[id].push_back(line.substr(line.find(' ') + 1));
    }
    return by_id;
  };
  std::map<std::string, std::vector<std::string>> effects = runs("effects");
  std::map<std::string, std::vector<std::string>> reboots = runs("reboots");
  int ran = 0, reruns = 0, rebooted = 0, interrupted = 0;
  auto terminal_of = [&](const std::string& id) -> std::string {
    auto it = results.find(id);
    if (it == results.end()) {
      violations.push_back(id + " has no terminal result");
      return "";
    }
    if (it->second.size() > 1) {
      violations.push_back(id + " has " + std::to_string(it->second.size()) +
                           " different terminal results");
    }
    return final_state[id];
  };
  for (int i = 0; i < options.commands; ++i) {
    std::string id = CommandId(i);
    std::string state = terminal_of(id);
    if (!state.empty() && state != "COMMAND_STATE_SUCCEEDED")
      violations.push_back(id + " ended " + state + ", not SUCCEEDED");
    // logs.collect is idempotent: a run that a killed bcd interrupted may run again in the next
    // bcd (a new pid). Twice in one bcd is a violation.
    const std::vector<std::string>& pids = effects[id];
    std::set<std::string> lives(pids.begin(), pids.end());
    if (lives.size() != pids.size())
      violations.push_back(id + " ran " + std::to_string(pids.size()) + " times in " +
                           std::to_string(lives.size()) + " bcd processes");
    ran += !pids.empty();
    reruns += pids.empty() ? 0 : static_cast<int>(pids.size()) - 1;
  }
  for (int i = 0; i < options.reboots; ++i) {
    std::string id = RebootId(i);
    std::string state = terminal_of(id);
    // Not idempotent: at most once in any bcd, and never when a restart said it was interrupted.
    // (A reboot asked for while another was due is that one: it may not run on its own.)
    std::size_t count = reboots[id].size();
    if (count > 1) violations.push_back(id + " rebooted " + std::to_string(count) + " times");
    if (state == "COMMAND_STATE_FAILED/COMMAND_CODE_INTERRUPTED") {
      ++interrupted;
      if (count != 0) violations.push_back(id + " was reported interrupted and rebooted");
    } else if (!state.empty() && state != "COMMAND_STATE_SUCCEEDED") {
      violations.push_back(id + " ended " + state);
    }
    rebooted += count != 0;
  }
  std::printf("ran %.1f s: %d gateway kills, %d bcd kills; bcd exited %d at the end\n", seconds,
              gateway_kills, node_kills, node_exit);
  if (gateway_kills < options.min_kills || node_kills < options.min_kills)
    violations.push_back("fewer kills than --min-kills " + std::to_string(options.min_kills));
  std::printf("node.reboot: %d, rebooted: %d, reported interrupted (never run): %d\n",
              options.reboots, rebooted, interrupted);
  std::printf("trust bundles taken: %zu, one trust.updated each\n", bundle_events.size());
  std::printf(
      "commands: %d, with a side effect: %d, run again by the next bcd after a kill "
      "interrupted them: %d; %.1f commands/s overall\n",
      options.commands, ran, reruns, options.commands / seconds);
  std::printf("sequence numbers: 1..%llu, %zu resent after a crash (same content)\n",
              static_cast<unsigned long long>(max_seq), resent);
  for (const auto& [state, count] : states)
    std::printf("  terminal updates %s: %d (a redelivered command is answered again)\n",
                state.c_str(), count);
  for (const auto& [kind, count] : events) std::printf("  event %s: %d\n", kind.c_str(), count);
  for (std::size_t i = 0; i < violations.size() && i < 20; ++i)
    std::printf("VIOLATION: %s\n", violations[i].c_str());
  std::printf("%s: %zu violations\n", violations.empty() ? "PASS" : "FAIL", violations.size());
  std::printf(
      "replay the kill schedule: bcd-soak --commands %d --reboots %d --seconds %d --min-kills %d "
      "--seed %llu\n",
      options.commands, options.reboots, options.seconds, options.min_kills,
      static_cast<unsigned long long>(options.seed));
  if (violations.empty() && !options.keep) std::filesystem::remove_all(dir);
  return violations.empty() ? 0 : 1;
}
