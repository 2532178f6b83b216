// bcd-soak: commands through crashes of either side.
//
//   bcd-soak [--commands N] [--seconds S] [--seed X] [--bcd PATH] [--keep]
//
// A control plane (the dev gateway in a child process, which records every update and event in its
// own fsynced log before it acks, and redelivers every command without a terminal result on each
// new session) sends N logs.collect commands to a `bcd node` (a real process). For S seconds the
// driver SIGKILLs the gateway or bcd at random moments and restarts it; then it lets the run
// finish. The side effect of each command is a line its journalctl run appends (a script first on
// PATH). Afterwards, from the gateway's log and the side-effect file:
//   - every command id has exactly one terminal result (all terminal updates for it agree),
//   - no command ran twice: logs.collect is idempotent, so one that a kill interrupted may run
//     again in the next bcd, but never twice in one bcd process (side-effect lines carry its pid),
//   - every sequence number from 1 to the highest arrived, and a resent one never changed.
// Prints the figures and exits 1 on any violation.

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

#include "daemon/record_log.h"
#include "pki/files.h"
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
  int seconds = 60;
  uint64_t seed = 0;
  std::string bcd = BCD_BINARY;
  bool keep = false;
  int64_t issued_at = 0;  // one time for every command, so a redelivery is byte for byte the same
};

std::string CommandId(int i) { return "soak-" + std::to_string(i); }

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
  uint64_t max_seq = 0;            // guarded by mu
  for (const std::string& record : records) {
    v1::AgentFrame frame;
    frame.ParseFromString(record);
    max_seq = std::max(max_seq, SeqOf(frame));
    if (frame.has_command_update() && bcd::proto::IsTerminal(frame.command_update().state()))
      terminal.insert(frame.command_update().command_id());
  }
  bcd::testing::DevGatewayOptions gateway_options;
  gateway_options.listen = "127.0.0.1:" + std::to_string(port);
  gateway_options.on_frame = [&](const std::string&, const v1::AgentFrame& frame) {
    if (SeqOf(frame) == 0) return;  // status, inventory, spec acks: not delivery
    std::lock_guard<std::mutex> lock(mu);
    if (absl::Status s = db->Append(frame.SerializeAsString()); !s.ok()) _exit(4);
    max_seq = std::max(max_seq, SeqOf(frame));
    if (frame.has_command_update() && bcd::proto::IsTerminal(frame.command_update().state()))
      terminal.insert(frame.command_update().command_id());
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
  while (true) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::vector<std::string> due;
    std::size_t in_flight = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (Clock::now() - last_progress > std::chrono::milliseconds(100)) {
        last_progress = Clock::now();
        (void)bcd::pki::AtomicWriteFile(
            dir / "progress", std::to_string(terminal.size()) + " " + std::to_string(max_seq),
            0600);
      }
      std::size_t now_sessions = (*gateway)->SessionNodes().size();
      if (now_sessions != sessions) {
        sessions = now_sessions;
        pushed.clear();
      }
      for (const std::string& id : pushed) in_flight += !terminal.contains(id);
      for (int i = 0; i < options.commands && in_flight + due.size() < 64; ++i) {
        std::string id = CommandId(i);
        if (!terminal.contains(id) && !pushed.contains(id)) due.push_back(id);
      }
    }
    for (const std::string& id : due) {
      v1::LogsCollectPayload payload;
      payload.set_upload_url(upload_url + "/" + id);
      payload.add_journal_units(id + ".service");
      v1::Command command;
      command.set_command_id(id);
      command.set_node_id(kNode);
      command.set_kind("logs.collect");
      command.set_payload(payload.SerializeAsString());
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
               "usage: bcd-soak [--commands N] [--seconds S] [--seed X] [--bcd PATH] [--keep]\n");
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
  std::printf("bcd-soak: %d commands, %d s of kills, seed %llu, files in %s\n", options.commands,
              options.seconds, static_cast<unsigned long long>(options.seed), dir.c_str());
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
  std::ofstream(dir / "config.toml") << bcd::testing::DevConfigToml(port, *pki, dir / "state");
  int joined = bcd::testing::WaitChild(bcd::testing::SpawnChild(
      {options.bcd, "join", "--config", (dir / "config.toml").string(), "--token", token}));
  if (joined != 0) return std::fprintf(stderr, "bcd-soak: bcd join exited %d\n", joined), 1;
  pid_t node = StartNode(options, dir);

  std::mt19937_64 random(options.seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(random); };
  int gateway_kills = 0, node_kills = 0;
  auto start = Clock::now();
  auto kills_end = start + std::chrono::seconds(options.seconds);
  while (Clock::now() < kills_end &&
         Progress(dir).first < static_cast<std::size_t>(options.commands)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(pick(200, 1500)));
    if (pick(0, 1) == 0) {
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
  while (Clock::now() < calm_end &&
         Progress(dir).first < static_cast<std::size_t>(options.commands)) {
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

  // The verdict, from the gateway's log and the side effects.
  std::vector<std::string> records;
  absl::StatusOr<bcd::RecordLog> db = bcd::RecordLog::Open(dir / "gateway.db", &records);
  if (!db.ok())
    return std::fprintf(stderr, "bcd-soak: %s\n", std::string(db.status().message()).c_str()), 1;
  std::vector<std::string> violations;
  std::map<uint64_t, std::string> by_seq;
  std::size_t resent = 0;
  std::map<std::string, std::set<std::string>> results;  // id -> distinct terminal results
  std::map<std::string, int> states, events;
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
    if (frame.has_event()) ++events[frame.event().kind()];
    if (!frame.has_command_update() || !bcd::proto::IsTerminal(frame.command_update().state()))
      continue;
    v1::CommandUpdate update = frame.command_update();
    update.clear_seq();
    update.clear_time_ms();
    results[update.command_id()].insert(update.SerializeAsString());
    std::string state = v1::CommandState_Name(update.state());
    if (update.code() != v1::COMMAND_CODE_UNSPECIFIED)
      state += "/" + v1::CommandCode_Name(update.code());
    ++states[state];
  }
  uint64_t max_seq = by_seq.empty() ? 0 : by_seq.rbegin()->first;
  for (uint64_t seq = 1; seq <= max_seq; ++seq) {
    if (!by_seq.contains(seq))
      violations.push_back("seq " + std::to_string(seq) + " never arrived");
  }
  // id -> the pid of the bcd that ran it, once per run.
  std::map<std::string, std::vector<std::string>> effects;
  {
    std::ifstream in(dir / "effects");
    for (std::string line; std::getline(in, line);)
      effects[line.substr(0, line.find('.'))].push_back(line.substr(line.find(' ') + 1));
  }
  int ran = 0, reruns = 0;
  for (int i = 0; i < options.commands; ++i) {
    std::string id = CommandId(i);
    auto it = results.find(id);
    if (it == results.end())
      violations.push_back(id + " has no terminal result");
    else if (it->second.size() > 1)
      violations.push_back(id + " has " + std::to_string(it->second.size()) +
                           " different terminal results");
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
  std::printf("ran %.1f s: %d gateway kills, %d bcd kills; bcd exited %d at the end\n", seconds,
              gateway_kills, node_kills, node_exit);
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
  if (violations.empty() && !options.keep) std::filesystem::remove_all(dir);
  return violations.empty() ? 0 : 1;
}
