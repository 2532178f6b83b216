#include "daemon/dispatcher.h"

#include <condition_variable>
#include <sstream>

#include "gtest/gtest.h"
#include "pki/envelope.h"
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
    ++runs_;
    started_.notify_all();
    // Like a real handler between two steps of work: look at the stop flag every 10 ms.
    auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!released_ && !stop.load() && std::chrono::steady_clock::now() < give_up) {
      cv_.wait_for(lock, std::chrono::milliseconds(10));
    }
    if (stop) return absl::CancelledError("stopped");
    return std::string("done");
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
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
                        .now = [] { return static_cast<int64_t>(std::time(nullptr)); }},
        &log_);
    auto handler = std::make_unique<BlockingHandler>();
    handler_ = handler.get();
    dispatcher_->Register("inventory.refresh", std::move(handler));
    auto reboot = std::make_unique<BlockingHandler>();
    reboot_ = reboot.get();
    dispatcher_->Register("node.reboot", std::move(reboot));
  }

  v1::SignedCommand Signed(const std::string& id, const std::string& kind, uint32_t timeout = 0) {
    v1::Command command;
    command.set_command_id(id);
    command.set_node_id("n-1");
    command.set_kind(kind);
    command.set_timeout_seconds(timeout);
    return pki_.SignCommand(command);
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
  std::unique_ptr<ResultStore> results_;
  std::optional<pki::TrustState> trust_;
  std::ostringstream log_text_;
  Logger log_{&log_text_, LogLevel::kInfo};
  std::unique_ptr<Dispatcher> dispatcher_;
  BlockingHandler* handler_ = nullptr;
  BlockingHandler* reboot_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::CommandUpdate> updates_;
  std::atomic<bool> slow_accepted_{false};
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
  dispatcher_->Submit(Signed("slow", "inventory.refresh", /*timeout=*/1), *trust_, false);
  ASSERT_TRUE(handler_->WaitStarted(1));
  std::optional<v1::CommandUpdate> done = WaitFor("slow", v1::COMMAND_STATE_TIMED_OUT);
  ASSERT_TRUE(done.has_value()) << log_text_.str();
  EXPECT_EQ(done->message(), "the command ran past its timeout");
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

}  // namespace
}  // namespace bcd
