#include "daemon/dispatch/dispatcher.h"

#include <signal.h>
#include <sys/resource.h>

#include <condition_variable>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "bettercompute/site/v1/site.pb.h"
#include "fmt/format.h"
#include "gtest/gtest.h"
#include "pki/envelope.h"
#include "pki/keys.h"
#include "proto/signing_input.h"
#include "testing/dev_pki.h"
#include "tests/unit/fake_root.h"

namespace bcd {
namespace {

namespace v1 = bettercompute::agent::v1;
using bcd::testing::DevPki;
using bcd::testing::FakeRoot;
using std::chrono::milliseconds;

// A handler that runs until released or stopped, and counts its runs.
class BlockingHandler final : public CommandHandler {
 public:
  absl::StatusOr<std::string> Run(const v1::Command&, const google::protobuf::Message&,
                                  const std::atomic<bool>& stop) override {
    std::unique_lock<std::mutex> lock(mu_);
    auto began = std::chrono::steady_clock::now();
    ++runs_;
    started_.notify_all();
    // Like a real handler between two steps of work: look at the stop flag every 10 ms.
    auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!released_ && release_one_ == 0 && !stop.load() &&
           std::chrono::steady_clock::now() < give_up) {
      cv_.wait_for(lock, std::chrono::milliseconds(10));
    }
    if (release_one_ > 0) --release_one_;
    last_run_ = std::chrono::steady_clock::now() - began;
    if (stop) return absl::CancelledError("stopped");
    return std::string("done");
  }
  // How long the last run lasted, until released or stopped.
  std::chrono::steady_clock::duration last_run() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_run_;
  }
  // Every run from now on ends at once.
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  // The run in progress (or the next) ends; later ones block again.
  void ReleaseOne() {
    std::lock_guard<std::mutex> lock(mu_);
    ++release_one_;
    cv_.notify_all();
  }
  bool WaitStarted(int runs) {
    std::unique_lock<std::mutex> lock(mu_);
    return started_.wait_for(lock, std::chrono::seconds(10), [&] { return runs_ >= runs; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_, started_;
  int runs_ = 0;
  bool released_ = false;
  int release_one_ = 0;
  std::chrono::steady_clock::duration last_run_{};
};

class DispatcherTest : public ::testing::Test {
 protected:
  DispatcherTest() : pki_(*DevPki::Create(std::time(nullptr))) {
    results_ = std::make_unique<ResultStore>(*ResultStore::Open(dir_.path(), std::time(nullptr)));
    trust_ =
        *pki::TrustState::FromFirstBundle(pki_.SignedBundle(1), pki_.join_service_key().Public());
    Build();
  }

  void Build() {
    dispatcher_ = std::make_unique<Dispatcher>(
        proto::Mode::kNode, "n-1", results_.get(),
        DispatcherHooks{.update =
                            [this](const v1::CommandUpdate& u) {
                              // Like an outbox append that waits on a slow disk.
                              if (slow_accepted_ && u.state() == v1::COMMAND_STATE_ACCEPTED)
                                std::this_thread::sleep_for(std::chrono::milliseconds(2));
                              std::lock_guard<std::mutex> lock(mu_);
                              updates_.push_back(u);
                              cv_.notify_all();
                            },
                        .now = [] { return static_cast<int64_t>(std::time(nullptr)); },
                        .event =
                            [this](const std::string& kind, const std::string& message) {
                              std::lock_guard<std::mutex> lock(mu_);
                              events_.emplace_back(kind, message);
                            }},
        &log_);
    auto handler = std::make_unique<BlockingHandler>();
    handler_ = handler.get();
    EXPECT_TRUE(dispatcher_->Register("inventory.refresh", std::move(handler)).ok());
    auto reboot = std::make_unique<BlockingHandler>();
    reboot_ = reboot.get();
    EXPECT_TRUE(dispatcher_->Register("node.reboot", std::move(reboot)).ok());
  }

  // A dispatcher for `mode` with no handlers, whose updates the test sees.
  std::unique_ptr<Dispatcher> Bare(proto::Mode mode,
                                   std::size_t keyed_workers = kKeyedLaneWorkers) {
    return std::make_unique<Dispatcher>(
        mode, "n-1", results_.get(),
        DispatcherHooks{.update =
                            [this](const v1::CommandUpdate& u) {
                              std::lock_guard<std::mutex> lock(mu_);
                              updates_.push_back(u);
                              cv_.notify_all();
                            },
                        .now = [] { return static_cast<int64_t>(std::time(nullptr)); }},
        &log_, keyed_workers);
  }

  v1::Command Make(const std::string& id, const std::string& kind, uint32_t timeout = 0) {
    v1::Command command;
    command.set_command_id(id);
    command.set_node_id("n-1");
    command.set_kind(kind);
    command.set_timeout_seconds(timeout);
    command.set_issued_at(static_cast<uint64_t>(issued_at_));
    command.set_expires_at(static_cast<uint64_t>(issued_at_ + 3600));
    return command;
  }
  v1::SignedCommand Signed(const std::string& id, const std::string& kind, uint32_t timeout = 0) {
    return pki_.SignCommand(Make(id, kind, timeout));
  }
  // The updates of `id` so far.
  std::vector<v1::CommandUpdate> UpdatesOf(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<v1::CommandUpdate> found;
    for (const auto& u : updates_) {
      if (u.command_id() == id) found.push_back(u);
    }
    return found;
  }

  // Waits until `id` has an update in `state`, and returns it.
  std::optional<v1::CommandUpdate> WaitFor(const std::string& id, v1::CommandState state) {
    std::unique_lock<std::mutex> lock(mu_);
    std::optional<v1::CommandUpdate> found;
    cv_.wait_for(lock, std::chrono::seconds(10), [&] {
      for (const auto& u : updates_) {
        if (u.command_id() == id && u.state() == state) found = u;
      }
      return found.has_value();
    });
    return found;
  }

  FakeRoot dir_;
  DevPki pki_;
  int64_t issued_at_ = std::time(nullptr);  // one time: a redelivery is byte for byte the same
  std::unique_ptr<ResultStore> results_;
  std::optional<pki::TrustState> trust_;
  std::ostringstream log_text_;
  Logger log_{&log_text_, LogLevel::kInfo};
  BlockingHandler* handler_ = nullptr;
  BlockingHandler* reboot_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::CommandUpdate> updates_;
  std::vector<std::pair<std::string, std::string>> events_;
  std::atomic<bool> slow_accepted_{false};
  // Last: destroyed first, while what its hooks reach still exists.
  std::unique_ptr<Dispatcher> dispatcher_;
};

TEST_F(DispatcherTest, AcceptedAlwaysComesBeforeRunning) {
  handler_->Release();  // every run ends at once: the lane races the submitting thread
  slow_accepted_ = true;
  for (int i = 0; i < 50; ++i) {
    std::string id = "c-" + std::to_string(i);
    dispatcher_->Submit(Signed(id, "inventory.refresh"), *trust_, false);
    ASSERT_TRUE(WaitFor(id, v1::COMMAND_STATE_SUCCEEDED)) << id;
  }
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, std::vector<v1::CommandState>> states;
  for (const auto& u : updates_) states[u.command_id()].push_back(u.state());
  for (const auto& [id, seen] : states) {
    EXPECT_EQ(seen,
              (std::vector<v1::CommandState>{v1::COMMAND_STATE_ACCEPTED, v1::COMMAND_STATE_RUNNING,
                                             v1::COMMAND_STATE_SUCCEEDED}))
        << id;
  }
}

TEST_F(DispatcherTest, ATimeoutStartsWhenTheCommandRuns) {
  // "slow" (1 s) waits in its lane behind "first" for longer than its timeout.
  dispatcher_->Submit(Signed("first", "inventory.refresh"), *trust_, false);
  ASSERT_TRUE(handler_->WaitStarted(1));
  dispatcher_->Submit(Signed("slow", "inventory.refresh", /*timeout=*/1), *trust_, false);
  ASSERT_TRUE(WaitFor("slow", v1::COMMAND_STATE_ACCEPTED));
  // The scenario, not a wait for a result: "slow" stays queued for longer than its timeout.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  handler_->ReleaseOne();  // "first" ends; "slow" runs, and its second starts now
  ASSERT_TRUE(WaitFor("first", v1::COMMAND_STATE_SUCCEEDED));
  std::optional<v1::CommandUpdate> done = WaitFor("slow", v1::COMMAND_STATE_TIMED_OUT);
  ASSERT_TRUE(done.has_value()) << log_text_.str();
  EXPECT_EQ(done->message(), "the command ran past its timeout");
  // It ran for its whole second: the handler saw the stop no sooner.
  EXPECT_GE(handler_->last_run(), std::chrono::seconds(1));
}

TEST_F(DispatcherTest, CancelsAQueuedCommandAtOnceAndARunningOneThroughItsStopFlag) {
  dispatcher_->Submit(Signed("first", "inventory.refresh"), *trust_, false);
  ASSERT_TRUE(handler_->WaitStarted(1));
  dispatcher_->Submit(Signed("second", "inventory.refresh"), *trust_, false);  // same lane: queued
  ASSERT_TRUE(WaitFor("second", v1::COMMAND_STATE_ACCEPTED));
  dispatcher_->Cancel("second", "operator changed their mind");
  std::optional<v1::CommandUpdate> second = WaitFor("second", v1::COMMAND_STATE_CANCELLED);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->message(), "operator changed their mind");
  dispatcher_->Cancel("first", "");
  std::optional<v1::CommandUpdate> first = WaitFor("first", v1::COMMAND_STATE_CANCELLED);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->message(), "cancelled");
}

TEST_F(DispatcherTest, ARestartReportsWhatItInterruptedExceptIdempotentKinds) {
  ASSERT_TRUE(results_->MarkRunning("reboot-1", "node.reboot").ok());
  ASSERT_TRUE(results_->MarkRunning("inv-1", "inventory.refresh").ok());
  dispatcher_->ReportInterrupted();
  std::optional<v1::CommandUpdate> reboot = WaitFor("reboot-1", v1::COMMAND_STATE_FAILED);
  ASSERT_TRUE(reboot.has_value());
  EXPECT_EQ(reboot->code(), v1::COMMAND_CODE_INTERRUPTED);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& u : updates_) EXPECT_NE(u.command_id(), "inv-1");
}

TEST_F(DispatcherTest, ASignedOnlySessionRefusesEveryUnsignedCommand) {
  handler_->Release();
  // inventory.refresh needs no signature on a gRPC session; on a signed-only one it does.
  v1::SignedCommand plain = Signed("plain", "inventory.refresh");
  plain.clear_signature();
  dispatcher_->Submit(plain, *trust_, false, /*signed_only=*/true);
  std::optional<v1::CommandUpdate> refused = WaitFor("plain", v1::COMMAND_STATE_REJECTED);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->code(), v1::COMMAND_CODE_UNSIGNED);
  EXPECT_EQ(refused->message(), "this session takes only signed commands");
  dispatcher_->Submit(Signed("signed", "inventory.refresh"), *trust_, false, /*signed_only=*/true);
  EXPECT_TRUE(WaitFor("signed", v1::COMMAND_STATE_SUCCEEDED).has_value());
}

TEST_F(DispatcherTest, UpgradeRequiredRefusesEverythingButDaemonUpgrade) {
  dispatcher_->Submit(Signed("c-1", "inventory.refresh"), *trust_, /*upgrade_required=*/true);
  std::optional<v1::CommandUpdate> refused = WaitFor("c-1", v1::COMMAND_STATE_REJECTED);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->code(), v1::COMMAND_CODE_UNSUPPORTED);
  EXPECT_EQ(refused->message(),
            "the gateway requires an upgrade: only daemon.upgrade runs until then");
}

TEST_F(DispatcherTest, ADestructiveKindNeedsItsQuorumAndKeepsToTheHourlyLimit) {
  std::vector<pki::PrivateKey> approvers = {*pki::PrivateKey::Generate(),
                                            *pki::PrivateKey::Generate()};
  pki::TrustState trust = *pki::TrustState::FromFirstBundle(
      pki_.SignedBundleWithApprovers(1, approvers, /*threshold=*/2, /*epoch=*/1,
                                     /*unbatched_per_hour=*/1),
      pki_.join_service_key().Public());
  auto approve = [&](v1::SignedCommand command, int count) {
    for (int i = 0; i < count; ++i) {
      *command.add_approvals() = *pki::Sign(proto::ApproveSigningInput(pki::Sha256(command.body())),
                                            approvers[i], "a" + std::to_string(i));
    }
    return command;
  };
  dispatcher_->Submit(approve(Signed("r-1", "node.reboot"), 1), trust, false);
  std::optional<v1::CommandUpdate> few = WaitFor("r-1", v1::COMMAND_STATE_REJECTED);
  ASSERT_TRUE(few.has_value());
  EXPECT_EQ(few->code(), v1::COMMAND_CODE_QUORUM);
  EXPECT_EQ(few->message(), "1 of 2 approvals needed");

  dispatcher_->Submit(approve(Signed("r-2", "node.reboot"), 2), trust, false);
  ASSERT_TRUE(WaitFor("r-2", v1::COMMAND_STATE_ACCEPTED));
  reboot_->Release();
  ASSERT_TRUE(WaitFor("r-2", v1::COMMAND_STATE_SUCCEEDED));

  dispatcher_->Submit(approve(Signed("r-3", "node.reboot"), 2), trust, false);
  std::optional<v1::CommandUpdate> limited = WaitFor("r-3", v1::COMMAND_STATE_REJECTED);
  ASSERT_TRUE(limited.has_value());
  EXPECT_EQ(limited->code(), v1::COMMAND_CODE_RATE_LIMITED);
}

TEST_F(DispatcherTest, RefusalsOfCommandsThatDidNotVerifyAreAnsweredButNotRemembered) {
  uint64_t before = std::filesystem::file_size(dir_.path() / "results.log");
  for (int i = 0; i < 200; ++i) {
    // Fresh ids a gateway could send without end: for another node, unsigned, badly signed.
    v1::Command other = Make("w-" + std::to_string(i), "inventory.refresh");
    other.set_node_id("n-2");
    dispatcher_->Submit(pki_.SignCommand(other), *trust_, false);
    v1::SignedCommand unsigned_reboot = Signed("u-" + std::to_string(i), "node.reboot");
    unsigned_reboot.clear_signature();
    dispatcher_->Submit(unsigned_reboot, *trust_, false);
    v1::SignedCommand forged = Signed("f-" + std::to_string(i), "inventory.refresh");
    forged.mutable_signature()->mutable_sig()->back() ^= 1;
    dispatcher_->Submit(forged, *trust_, false);
  }
  ASSERT_TRUE(WaitFor("f-199", v1::COMMAND_STATE_REJECTED));
  EXPECT_EQ(UpdatesOf("w-7").at(0).code(), v1::COMMAND_CODE_WRONG_NODE);
  EXPECT_EQ(UpdatesOf("u-7").at(0).code(), v1::COMMAND_CODE_UNSIGNED);
  EXPECT_EQ(UpdatesOf("f-7").at(0).code(), v1::COMMAND_CODE_BAD_SIGNATURE);
  EXPECT_EQ(results_->size(), 0u);
  EXPECT_EQ(std::filesystem::file_size(dir_.path() / "results.log"), before) << "nothing written";
  // A refusal of a command whose signature verified is its result, kept like any other.
  dispatcher_->Submit(Signed("v-1", "no.such.kind"), *trust_, false);
  ASSERT_TRUE(WaitFor("v-1", v1::COMMAND_STATE_REJECTED));
  EXPECT_EQ(results_->Terminal("v-1")->code(), v1::COMMAND_CODE_UNSUPPORTED);
}

TEST_F(DispatcherTest, AFullResultStoreRefusesCommandsBusyAndSaysSoOnce) {
  dispatcher_.reset();
  results_.reset();
  FakeRoot small;
  results_ = std::make_unique<ResultStore>(
      *ResultStore::Open(small.path(), std::time(nullptr), {.max_entries = 2}));
  Build();
  handler_->Release();
  for (const char* id : {"c-1", "c-2"}) {
    dispatcher_->Submit(Signed(id, "inventory.refresh"), *trust_, false);
    ASSERT_TRUE(WaitFor(id, v1::COMMAND_STATE_SUCCEEDED)) << id;
  }
  for (const char* id : {"c-3", "c-4"}) {
    dispatcher_->Submit(Signed(id, "inventory.refresh"), *trust_, false);
    std::optional<v1::CommandUpdate> busy = WaitFor(id, v1::COMMAND_STATE_REJECTED);
    ASSERT_TRUE(busy.has_value()) << id;
    EXPECT_EQ(busy->code(), v1::COMMAND_CODE_BUSY);
    EXPECT_EQ(busy->message().substr(0, 31), "the result store is full (2 res");
  }
  std::lock_guard<std::mutex> lock(mu_);
  ASSERT_EQ(events_.size(), 1u) << "one event for the whole episode";
  EXPECT_EQ(events_[0].first, "results.full");
}

TEST_F(DispatcherTest, EveryCommandMustExpireWithinTheTimeItsResultIsRemembered) {
  int64_t now = std::time(nullptr);
  auto refused = [&](const std::string& id, int64_t issued, int64_t expires) {
    v1::Command command = Make(id, "inventory.refresh");
    command.set_issued_at(static_cast<uint64_t>(issued));
    command.set_expires_at(static_cast<uint64_t>(expires));
    dispatcher_->Submit(pki_.SignCommand(command), *trust_, false);
    std::optional<v1::CommandUpdate> update = WaitFor(id, v1::COMMAND_STATE_REJECTED);
    EXPECT_TRUE(update.has_value()) << id << " was taken";
    if (!update) return std::string();
    EXPECT_EQ(update->code(), v1::COMMAND_CODE_EXPIRED) << id;
    return update->message();
  };
  EXPECT_EQ(refused("never", now, 0),
            "the command has no expires_at: bcd runs only commands that expire");
  EXPECT_EQ(refused("too-long", now, now + 25 * 3600),
            fmt::format("the command lives until {} (90000 s after issued_at {}): at most 86400 s, "
                        "the time bcd remembers a result",
                        now + 25 * 3600, now));
  std::string future = refused("future", now + 3600, now + 7200);
  EXPECT_EQ(future.substr(0, future.find(" (now")),  // the dispatcher's clock may be a second on
            fmt::format("issued_at {} is in the future: it must be set and at most 300 s ahead of "
                        "this node's clock",
                        now + 3600));
  EXPECT_EQ(refused("unissued", 0, now + 60).substr(0, 19), "issued_at 0 is unse");
  EXPECT_EQ(results_->size(), 0u);
}

TEST_F(DispatcherTest, ACommandIdThatCouldNameAPathOrBreakALineIsRefused) {
  for (std::string id : {std::string("../../etc/passwd"), std::string("a b"), std::string("x\ny"),
                         std::string(".hidden"), std::string(129, 'a')}) {
    dispatcher_->Submit(Signed(id, "inventory.refresh"), *trust_, false);
    std::optional<v1::CommandUpdate> refused = WaitFor(id, v1::COMMAND_STATE_REJECTED);
    ASSERT_TRUE(refused.has_value()) << id;
    EXPECT_EQ(refused->code(), v1::COMMAND_CODE_INVALID_PAYLOAD);
    EXPECT_EQ(refused->message(),
              "command_id must be 1 to 128 letters, digits and -_.: starting with a letter or "
              "digit");
  }
  dispatcher_->Submit(Signed(std::string(128, 'a'), "inventory.refresh"), *trust_, false);
  EXPECT_TRUE(WaitFor(std::string(128, 'a'), v1::COMMAND_STATE_ACCEPTED)) << "128 is allowed";
  EXPECT_TRUE(IsCommandId("018f2b6e-7c1a-7d3e-9f00-0a1b2c3d4e5f"));
  EXPECT_TRUE(IsCommandId("wf-1:step.2_a"));
}

// A handler that refuses some payloads before they run.
class PickyHandler final : public CommandHandler {
 public:
  absl::Status Validate(const v1::Command& command,
                        const google::protobuf::Message&) const override {
    if (command.timeout_seconds() == 7) return absl::InvalidArgumentError("7 is not allowed");
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Run(const v1::Command&, const google::protobuf::Message&,
                                  const std::atomic<bool>&) override {
    ++runs;
    return std::string();
  }
  std::atomic<int> runs{0};
};

TEST_F(DispatcherTest, APayloadItsHandlerRefusesIsRejectedBeforeItIsAccepted) {
  auto picky = std::make_unique<PickyHandler>();
  PickyHandler* handler = picky.get();
  ASSERT_TRUE(dispatcher_->Register("logs.collect", std::move(picky)).ok());
  dispatcher_->Submit(Signed("bad", "logs.collect", /*timeout=*/7), *trust_, false);
  std::optional<v1::CommandUpdate> refused = WaitFor("bad", v1::COMMAND_STATE_REJECTED);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->code(), v1::COMMAND_CODE_INVALID_PAYLOAD);
  EXPECT_EQ(refused->message(), "7 is not allowed");
  EXPECT_EQ(UpdatesOf("bad").size(), 1u) << "never ACCEPTED, never RUNNING";
  EXPECT_EQ(handler->runs, 0);
  dispatcher_->Submit(Signed("good", "logs.collect", /*timeout=*/8), *trust_, false);
  EXPECT_TRUE(WaitFor("good", v1::COMMAND_STATE_SUCCEEDED));
}

TEST_F(DispatcherTest, AnHourlyCountThatCannotBeWrittenIsAnInternalErrorNotRateLimited) {
  std::vector<pki::PrivateKey> approvers = {*pki::PrivateKey::Generate()};
  pki::TrustState trust = *pki::TrustState::FromFirstBundle(
      pki_.SignedBundleWithApprovers(1, approvers, /*threshold=*/1, /*epoch=*/1,
                                     /*unbatched_per_hour=*/5),
      pki_.join_service_key().Public());
  v1::SignedCommand reboot = Signed("r-1", "node.reboot");
  *reboot.add_approvals() =
      *pki::Sign(proto::ApproveSigningInput(pki::Sha256(reboot.body())), approvers[0], "a0");
  // The disk refuses to grow the result log: no file may be larger than it is now.
  signal(SIGXFSZ, SIG_IGN);
  rlimit before{};
  getrlimit(RLIMIT_FSIZE, &before);
  rlimit small = before;
  small.rlim_cur = std::filesystem::file_size(dir_.path() / "results.log");
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  dispatcher_->Submit(reboot, trust, false);
  std::optional<v1::CommandUpdate> refused = WaitFor("r-1", v1::COMMAND_STATE_REJECTED);
  setrlimit(RLIMIT_FSIZE, &before);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(v1::CommandCode_Name(refused->code()), "COMMAND_CODE_INTERNAL");
  EXPECT_EQ(refused->message().substr(0, 68),
            "the hourly count of destructive commands could not be recorded: cann");
}

TEST_F(DispatcherTest, ADifferentCommandUnderAnAnsweredIdIsDuplicateTheSameBytesGetTheResult) {
  handler_->Release();
  v1::SignedCommand first = Signed("c-1", "inventory.refresh");
  dispatcher_->Submit(first, *trust_, false);
  ASSERT_TRUE(WaitFor("c-1", v1::COMMAND_STATE_SUCCEEDED));
  dispatcher_->Submit(Signed("c-1", "inventory.refresh", /*timeout=*/30), *trust_, false);
  std::optional<v1::CommandUpdate> duplicate = WaitFor("c-1", v1::COMMAND_STATE_REJECTED);
  ASSERT_TRUE(duplicate.has_value());
  EXPECT_EQ(duplicate->code(), v1::COMMAND_CODE_DUPLICATE);
  EXPECT_EQ(duplicate->message(), "a different command with this id was answered before");
  dispatcher_->Submit(Signed("c-1", "node.reboot"), *trust_, false);  // even another kind
  EXPECT_EQ(UpdatesOf("c-1").back().code(), v1::COMMAND_CODE_DUPLICATE);
  // The same bytes again: the stored result, and it still is the id's result.
  dispatcher_->Submit(first, *trust_, false);
  EXPECT_EQ(UpdatesOf("c-1").back().state(), v1::COMMAND_STATE_SUCCEEDED);
  EXPECT_EQ(results_->Terminal("c-1")->state(), v1::COMMAND_STATE_SUCCEEDED);
  // Redelivered with another signature (re-signed), the body is the same: the stored result.
  v1::SignedCommand resigned = first;
  resigned.mutable_signature()->set_kid("worker-2");
  dispatcher_->Submit(resigned, *trust_, false);
  EXPECT_EQ(UpdatesOf("c-1").back().state(), v1::COMMAND_STATE_SUCCEEDED);
}

// A typed handler of node.reboot's types, whatever kind it is registered for.
class RebootTyped final : public TypedHandler<v1::NodeRebootPayload, v1::NodeRebootResult> {
 public:
  absl::Status Check(const v1::Command&, const v1::NodeRebootPayload& payload) const override {
    if (payload.reason() == "bad") return absl::InvalidArgumentError("reason is bad");
    return absl::OkStatus();
  }
  absl::StatusOr<v1::NodeRebootResult> Execute(const v1::Command&,
                                               const v1::NodeRebootPayload& payload,
                                               const std::atomic<bool>&) override {
    v1::NodeRebootResult result;
    result.set_scheduled_at(payload.delay_seconds() + 1000);
    return result;
  }
};

TEST_F(DispatcherTest, RegisterRefusesWhatTheKindTableDoesNotGiveThisMode) {
  absl::Status unknown = dispatcher_->Register("no.such", std::make_unique<BlockingHandler>());
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(unknown.message(), "kind \"no.such\" is not in the kind table");
  absl::Status site = dispatcher_->Register("bmc.powerOn", std::make_unique<BlockingHandler>());
  EXPECT_EQ(site.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(site.message(), "kind \"bmc.powerOn\" does not run in node mode (the kind table)");
  absl::Status types = dispatcher_->Register("logs.collect", std::make_unique<RebootTyped>());
  EXPECT_EQ(types.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(types.message(),
            "the handler of \"logs.collect\" works with bettercompute.agent.v1.NodeRebootPayload, "
            "the kind table says bettercompute.agent.v1.LogsCollectPayload");
  absl::Status twice =
      dispatcher_->Register("inventory.refresh", std::make_unique<BlockingHandler>());
  EXPECT_EQ(twice.code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(DispatcherTest, AKindOfThisModeWithoutAHandlerIsListedAndRefusedSayingSo) {
  EXPECT_EQ(dispatcher_->Unhandled(),
            (std::vector<std::string>{"logs.collect", "daemon.upgrade", "driver.invoke"}));
  dispatcher_->Submit(Signed("c-driver", "driver.invoke"), *trust_, false);
  std::optional<v1::CommandUpdate> refused = WaitFor("c-driver", v1::COMMAND_STATE_REJECTED);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->code(), v1::COMMAND_CODE_UNSUPPORTED);
  EXPECT_EQ(refused->message(),
            "kind \"driver.invoke\" is a node mode kind this build does not run yet");
}

TEST_F(DispatcherTest, ATypedHandlerGetsItsPayloadTypeAndItsResultIsEncoded) {
  // Rebuilt without the blocking node.reboot handler, so the typed one can take the kind.
  dispatcher_ = Bare(proto::Mode::kNode);
  ASSERT_TRUE(dispatcher_->Register("node.reboot", std::make_unique<RebootTyped>()).ok());
  v1::NodeRebootPayload payload;
  payload.set_delay_seconds(7);
  v1::Command good = Make("c-good", "node.reboot");
  good.set_payload(payload.SerializeAsString());
  dispatcher_->Submit(pki_.SignCommand(good), *trust_, false);
  std::optional<v1::CommandUpdate> done = WaitFor("c-good", v1::COMMAND_STATE_SUCCEEDED);
  ASSERT_TRUE(done.has_value());
  v1::NodeRebootResult result;
  ASSERT_TRUE(result.ParseFromString(done->result()));
  EXPECT_EQ(result.scheduled_at(), 1007u);
  payload.set_reason("bad");
  v1::Command bad = Make("c-bad", "node.reboot");
  bad.set_payload(payload.SerializeAsString());
  dispatcher_->Submit(pki_.SignCommand(bad), *trust_, false);
  std::optional<v1::CommandUpdate> refused = WaitFor("c-bad", v1::COMMAND_STATE_REJECTED);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->code(), v1::COMMAND_CODE_INVALID_PAYLOAD);
  EXPECT_EQ(refused->message(), "reason is bad");
}

// A BMC operation that runs until the test releases it, and records what ran side by side.
class HeldBmcHandler final : public TypedHandler<bettercompute::site::v1::BmcPowerPayload,
                                                 bettercompute::site::v1::BmcPowerResult> {
 public:
  std::string Key(const v1::Command&,
                  const bettercompute::site::v1::BmcPowerPayload& payload) const override {
    return payload.bmc().address();
  }
  absl::StatusOr<bettercompute::site::v1::BmcPowerResult> Execute(
      const v1::Command& command, const bettercompute::site::v1::BmcPowerPayload& payload,
      const std::atomic<bool>& stop) override {
    std::unique_lock<std::mutex> lock(mu_);
    const std::string& key = payload.bmc().address();
    running_.push_back(command.command_id());
    max_total_ = std::max(max_total_, running_.size());
    max_per_key_ = std::max(max_per_key_, ++per_key_[key]);
    cv_.notify_all();
    cv_.wait(lock, [&] { return released_.contains(command.command_id()) || stop; });
    std::erase(running_, command.command_id());
    --per_key_[key];
    bettercompute::site::v1::BmcPowerResult result;
    result.set_power_state("on");
    return result;
  }
  // Waits until exactly `ids` run (in any order).
  bool WaitRunning(std::vector<std::string> ids) {
    std::sort(ids.begin(), ids.end());
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] {
      std::vector<std::string> now = running_;
      std::sort(now.begin(), now.end());
      return now == ids;
    });
  }
  void Release(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    released_.insert(id);
    cv_.notify_all();
  }
  std::size_t max_total() {
    std::lock_guard<std::mutex> lock(mu_);
    return max_total_;
  }
  int max_per_key() {
    std::lock_guard<std::mutex> lock(mu_);
    return max_per_key_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> running_;
  std::map<std::string, int> per_key_;
  std::set<std::string> released_;
  std::size_t max_total_ = 0;
  int max_per_key_ = 0;
};

TEST_F(DispatcherTest, ThePerBmcLaneRunsOneCommandPerBmcAndBmcsSideBySideUpToItsBound) {
  dispatcher_ = Bare(proto::Mode::kSite, /*keyed_workers=*/2);
  auto held = std::make_unique<HeldBmcHandler>();
  HeldBmcHandler* bmc = held.get();
  ASSERT_TRUE(dispatcher_->Register("bmc.powerStatus", std::move(held)).ok());
  auto submit = [&](const std::string& id, const std::string& address) {
    bettercompute::site::v1::BmcPowerPayload payload;
    payload.mutable_bmc()->set_address(address);
    v1::Command command = Make(id, "bmc.powerStatus");
    command.set_payload(payload.SerializeAsString());
    dispatcher_->Submit(pki_.SignCommand(command), *trust_, false);
  };
  submit("a-1", "10.0.0.1");
  submit("a-2", "10.0.0.1");  // the same BMC: waits for a-1
  submit("b-1", "10.0.0.2");  // another BMC: runs beside a-1
  submit("c-1", "10.0.0.3");  // a third: waits for the bound of two
  ASSERT_TRUE(bmc->WaitRunning({"a-1", "b-1"}));
  bmc->Release("a-1");
  // a-1's worker takes the first job it may run: a-2 (its BMC is free again), before c-1.
  ASSERT_TRUE(bmc->WaitRunning({"a-2", "b-1"}));
  bmc->Release("b-1");
  ASSERT_TRUE(bmc->WaitRunning({"a-2", "c-1"}));
  bmc->Release("a-2");
  bmc->Release("c-1");
  for (const char* id : {"a-1", "a-2", "b-1", "c-1"}) {
    ASSERT_TRUE(WaitFor(id, v1::COMMAND_STATE_SUCCEEDED)) << id;
  }
  EXPECT_EQ(bmc->max_total(), 2u);
  EXPECT_EQ(bmc->max_per_key(), 1);
}

}  // namespace
}  // namespace bcd
