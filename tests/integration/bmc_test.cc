// The bmc.* kinds of a site agent against real BMC software on loopback: the Redfish emulator
// (testing/bmc/redfish_bmc.py, itself checked by sushy and redfishtool in redfish_clients_test)
// and Debian's ipmi_sim driven by ipmitool. Commands come signed from the dev gateway, the BMC
// credentials are secrets bound to the command's workflow step.

#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/subprocess.h"
#include "bettercompute/site/v1/site.pb.h"
#include "gtest/gtest.h"
#include "modes/site/site_mode.h"
#include "testing/bmc_emulators.h"
#include "testing/child_process.h"
#include "tests/integration/joined_node.h"
#include "tests/unit/fake_root.h"

namespace bcd {
namespace {

namespace v1 = bettercompute::agent::v1;
namespace site = bettercompute::site::v1;
using bcd::testing::DevPki;
using bcd::testing::FakeRoot;
using bcd::testing::IpmiBmc;
using bcd::testing::JoinedNode;
using bcd::testing::RedfishBmc;
using std::chrono::seconds;

constexpr auto kWait = seconds(60);
constexpr char kPassword[] = "S3cret-bmc-1";
constexpr char kNewPassword[] = "N3w-bmc-pass";

class Bmc : public ::testing::Test {
 protected:
  // `site` is the [site] table of the agent's config ("" for none).
  explicit Bmc(std::string site = "")
      : node_(std::make_unique<JoinedNode>(JoinedNode::Options{
            .node_id = "n-1",
            .extra_config = [site](const std::filesystem::path&) { return site; },
            .log_level = LogLevel::kDebug})) {
    node_->gateway->AddSecret("bmc/cred", std::string("admin:") + kPassword,
                              {"wf-1", "step-1", ""});
    node_->gateway->AddSecret("bmc/new", std::string("admin:") + kNewPassword,
                              {"wf-1", "step-1", ""});
    node_->gateway->AddSecret("bmc/wrong", "admin:not-the-password", {"wf-1", "step-1", ""});
    node_->gateway->AddSecret("bmc/latin1", "admin:p\xe4ss", {"wf-1", "step-1", ""});
    node_->Start(std::make_unique<SiteMode>());
    EXPECT_TRUE(node_->gateway->WaitForWelcomes(1, kWait));
  }
  ~Bmc() override {
    node_->Stop();
    // Whatever happened, no password reached bcd's log.
    std::string log = node_->LogText();
    EXPECT_EQ(log.find(kPassword), std::string::npos) << log;
    EXPECT_EQ(log.find(kNewPassword), std::string::npos) << log;
    EXPECT_EQ(log.find("not-the-password"), std::string::npos) << log;
  }

  std::unique_ptr<RedfishBmc> StartRedfish(std::vector<std::string> args = {},
                                           const std::string& name = "redfish") {
    absl::StatusOr<std::unique_ptr<RedfishBmc>> bmc =
        RedfishBmc::Start(bmcs_.path() / name, {.password = kPassword, .args = std::move(args)});
    EXPECT_TRUE(bmc.ok()) << bmc.status();
    return bmc.ok() ? *std::move(bmc) : nullptr;
  }

  static site::BmcTarget Redfish(const RedfishBmc& bmc, const std::string& ref = "bmc/cred") {
    site::BmcTarget target;
    target.set_address(bmc.address());
    target.set_credential_ref(ref);
    target.set_protocol(site::BMC_PROTOCOL_REDFISH);
    target.set_tls_spki_sha256(bmc.spki_sha256());
    return target;
  }
  static site::BmcTarget Ipmi(const IpmiBmc& bmc, const std::string& ref = "bmc/cred") {
    site::BmcTarget target;
    target.set_address(bmc.address());
    target.set_credential_ref(ref);
    target.set_protocol(site::BMC_PROTOCOL_IPMI);
    return target;
  }

  // Sends `kind` with `payload` (signed, bound to wf-1/step-1) and returns its terminal update.
  void Send(const std::string& id, const std::string& kind,
            const google::protobuf::Message& payload, uint32_t timeout_seconds = 0) {
    node_->SendCommand(id, kind, payload, "wf-1", "step-1", timeout_seconds);
  }
  v1::CommandUpdate Wait(const std::string& id) { return node_->WaitTerminal(id, kWait); }
  v1::CommandUpdate Run(const std::string& id, const std::string& kind,
                        const google::protobuf::Message& payload, uint32_t timeout_seconds = 0) {
    Send(id, kind, payload, timeout_seconds);
    return Wait(id);
  }

  site::BmcPowerResult Power(const std::string& id, const std::string& kind,
                             const site::BmcTarget& target) {
    site::BmcPowerPayload payload;
    *payload.mutable_bmc() = target;
    v1::CommandUpdate update = Run(id, kind, payload);
    EXPECT_EQ(update.state(), v1::COMMAND_STATE_SUCCEEDED) << id << ": " << update.message();
    site::BmcPowerResult result;
    EXPECT_TRUE(result.ParseFromString(update.result()));
    return result;
  }
  // The message of a command expected to fail.
  std::string Failure(const std::string& id, const std::string& kind,
                      const google::protobuf::Message& payload, uint32_t timeout_seconds = 0) {
    v1::CommandUpdate update = Run(id, kind, payload, timeout_seconds);
    EXPECT_TRUE(update.state() == v1::COMMAND_STATE_FAILED ||
                update.state() == v1::COMMAND_STATE_TIMED_OUT)
        << id << ": " << v1::CommandState_Name(update.state()) << " " << update.message();
    return update.message();
  }

  FakeRoot bmcs_;
  std::unique_ptr<JoinedNode> node_;
};

nlohmann::json SystemState(const RedfishBmc& bmc) { return (*bmc.State())["systems"]["1"]; }

site::BmcPowerPayload PowerPayload(const site::BmcTarget& target) {
  site::BmcPowerPayload payload;
  *payload.mutable_bmc() = target;
  return payload;
}

site::BmcSetBootDevicePayload BootPayload(const site::BmcTarget& target, const std::string& device,
                                          bool persistent, bool uefi) {
  site::BmcSetBootDevicePayload payload;
  *payload.mutable_bmc() = target;
  payload.set_device(device);
  payload.set_persistent(persistent);
  payload.set_uefi(uefi);
  return payload;
}

// The resets a Redfish BMC was asked for, in order.
std::vector<std::string> Resets(const RedfishBmc& bmc) {
  std::vector<std::string> resets;
  nlohmann::json state = *bmc.State();
  for (const auto& entry : state["log"]) {
    if (entry.value("path", "").ends_with("ComputerSystem.Reset")) resets.push_back("reset");
  }
  return resets;
}

TEST_F(Bmc, RedfishPowerOnOffCycleAndStatusReadTheStateBack) {
  std::unique_ptr<RedfishBmc> bmc = StartRedfish({"--power-delay", "0.5"});
  ASSERT_TRUE(bmc);
  site::BmcTarget target = Redfish(*bmc);
  site::BmcPowerResult status = Power("c-status", "bmc.powerStatus", target);
  EXPECT_EQ(status.power_state(), "off");
  EXPECT_EQ(status.protocol(), site::BMC_PROTOCOL_REDFISH);
  // The state changes a moment after the reset: the result waits for it.
  EXPECT_EQ(Power("c-on", "bmc.powerOn", target).power_state(), "on");
  EXPECT_EQ(SystemState(*bmc)["power"], "On");
  EXPECT_EQ(Power("c-cycle", "bmc.powerCycle", target).power_state(), "on");
  EXPECT_EQ(Power("c-off", "bmc.powerOff", target).power_state(), "off");
  EXPECT_EQ(SystemState(*bmc)["power"], "Off");
  nlohmann::json state = *bmc->State();
  EXPECT_EQ(state["sessions"], 0) << "every session was deleted";
  std::vector<std::string> posts;
  for (const auto& entry : state["log"]) {
    if (entry["method"] == "POST" || entry["method"] == "DELETE") posts.push_back(entry["path"]);
  }
  EXPECT_EQ(std::count(posts.begin(), posts.end(), "/redfish/v1/SessionService/Sessions"), 4);
  EXPECT_EQ(Resets(*bmc).size(), 3u);  // On, PowerCycle, ForceOff
}

TEST_F(Bmc, RedfishWithoutPowerCycleCyclesByOffThenOn) {
  std::unique_ptr<RedfishBmc> bmc = StartRedfish({"--reset-types", "On,ForceOff"});
  ASSERT_TRUE(bmc);
  site::BmcTarget target = Redfish(*bmc);
  EXPECT_EQ(Power("c-on", "bmc.powerOn", target).power_state(), "on");
  EXPECT_EQ(Power("c-cycle", "bmc.powerCycle", target).power_state(), "on");
  EXPECT_EQ(Resets(*bmc).size(), 3u);  // On; ForceOff, On
}

TEST_F(Bmc, RedfishWithoutSessionsFallsBackToBasicAuth) {
  std::unique_ptr<RedfishBmc> bmc = StartRedfish({"--no-sessions"});
  ASSERT_TRUE(bmc);
  EXPECT_EQ(Power("c-status", "bmc.powerStatus", Redfish(*bmc)).power_state(), "off");
}

TEST_F(Bmc, RedfishBootDeviceWithETagsOnceOrPersistentUefiOrLegacy) {
  std::unique_ptr<RedfishBmc> bmc = StartRedfish({"--require-etag"});
  ASSERT_TRUE(bmc);
  v1::CommandUpdate pxe =
      Run("c-pxe", "bmc.setBootDevice", BootPayload(Redfish(*bmc), "pxe", true, true));
  ASSERT_EQ(pxe.state(), v1::COMMAND_STATE_SUCCEEDED) << pxe.message();
  site::BmcSetBootDeviceResult result;
  ASSERT_TRUE(result.ParseFromString(pxe.result()));
  EXPECT_EQ(result.device(), "pxe");
  nlohmann::json boot = SystemState(*bmc)["boot"];
  EXPECT_EQ(boot["BootSourceOverrideTarget"], "Pxe");
  EXPECT_EQ(boot["BootSourceOverrideEnabled"], "Continuous");
  EXPECT_EQ(boot["BootSourceOverrideMode"], "UEFI");
  v1::CommandUpdate cd =
      Run("c-cd", "bmc.setBootDevice", BootPayload(Redfish(*bmc), "cdrom", false, false));
  ASSERT_EQ(cd.state(), v1::COMMAND_STATE_SUCCEEDED) << cd.message();
  boot = SystemState(*bmc)["boot"];
  EXPECT_EQ(boot["BootSourceOverrideTarget"], "Cd");
  EXPECT_EQ(boot["BootSourceOverrideEnabled"], "Once");
  EXPECT_EQ(boot["BootSourceOverrideMode"], "Legacy");
}

TEST_F(Bmc, RedfishFailuresNameTheBmcAndTheCause) {
  std::unique_ptr<RedfishBmc> bmc =
      StartRedfish({"--reset-types", "On", "--boot-targets", "None,Pxe,Hdd", "--no-boot-mode"});
  ASSERT_TRUE(bmc);
  std::string where = "BMC 127.0.0.1:" + std::to_string(bmc->port());
  std::string wrong =
      Failure("c-wrong", "bmc.powerStatus", PowerPayload(Redfish(*bmc, "bmc/wrong")));
  EXPECT_NE(wrong.find(where + ": the BMC refused the credential of admin"), std::string::npos)
      << wrong;
  std::string latin1 =
      Failure("c-latin1", "bmc.powerStatus", PowerPayload(Redfish(*bmc, "bmc/latin1")));
  EXPECT_EQ(latin1, "the secret bmc/latin1 is not a BMC credential: it is not UTF-8 text");
  site::BmcTarget pinned = Redfish(*bmc);
  pinned.set_tls_spki_sha256(std::string(32, 'x'));
  std::string pin = Failure("c-pin", "bmc.powerStatus", PowerPayload(pinned));
  EXPECT_NE(pin.find("its certificate's key has sha256 " + bmc->spki_sha256_hex() +
                     ", not the pinned 7878"),
            std::string::npos)
      << pin;
  site::BmcTarget system = Redfish(*bmc);
  system.set_system_id("7");
  std::string unknown = Failure("c-system", "bmc.powerStatus", PowerPayload(system));
  EXPECT_NE(unknown.find(where + ": no system \"7\" (it has 1)"), std::string::npos) << unknown;
  std::string device =
      Failure("c-cd", "bmc.setBootDevice", BootPayload(Redfish(*bmc), "cdrom", false, false));
  EXPECT_NE(device.find(where + ": the BMC does not offer boot from cdrom (Cd); it offers None, "
                                "Pxe, Hdd"),
            std::string::npos)
      << device;
  std::string uefi =
      Failure("c-uefi", "bmc.setBootDevice", BootPayload(Redfish(*bmc), "pxe", false, true));
  EXPECT_NE(uefi.find("no BootSourceOverrideMode"), std::string::npos) << uefi;
  std::string reset = Failure("c-off", "bmc.powerOff", PowerPayload(Redfish(*bmc)));
  EXPECT_NE(reset.find(where + ": the BMC allows no reset type for power off (it allows On)"),
            std::string::npos)
      << reset;
  site::BmcTarget closed = Redfish(*bmc);
  closed.set_address("127.0.0.1:" + std::to_string(testing::FreeLoopbackPort()));
  std::string refused = Failure("c-closed", "bmc.powerStatus", PowerPayload(closed));
  EXPECT_NE(refused.find("Redfish is not served"), std::string::npos) << refused;
  EXPECT_NE(refused.find("refused"), std::string::npos) << refused;
  // A BMC that answers slowly: the command ends at its timeout, it does not hang.
  ASSERT_TRUE(bmc->SetFaults({{"slow_seconds", 30}}).ok());
  auto began = std::chrono::steady_clock::now();
  v1::CommandUpdate slow = Run("c-slow", "bmc.powerStatus", PowerPayload(Redfish(*bmc)), 2);
  EXPECT_EQ(slow.state(), v1::COMMAND_STATE_TIMED_OUT) << slow.message();
  EXPECT_LT(std::chrono::steady_clock::now() - began, seconds(20));
  ASSERT_TRUE(bmc->SetFaults({{"slow_seconds", 0}}).ok());
  // The lane is free again.
  EXPECT_EQ(Power("c-after", "bmc.powerStatus", Redfish(*bmc)).power_state(), "off");
}

TEST_F(Bmc, RedfishRotateSetsVerifiesAndTheOldCredentialStopsWorking) {
  std::unique_ptr<RedfishBmc> bmc = StartRedfish({"--require-etag"});
  ASSERT_TRUE(bmc);
  site::BmcRotatePayload rotate;
  *rotate.mutable_bmc() = Redfish(*bmc);
  rotate.set_new_credential_ref("bmc/new");
  v1::CommandUpdate update = Run("c-rotate", "bmc.rotate", rotate);
  ASSERT_EQ(update.state(), v1::COMMAND_STATE_SUCCEEDED) << update.message();
  site::BmcRotateResult result;
  ASSERT_TRUE(result.ParseFromString(update.result()));
  EXPECT_TRUE(result.verified());
  EXPECT_EQ(Power("c-new", "bmc.powerStatus", Redfish(*bmc, "bmc/new")).power_state(), "off");
  std::string old = Failure("c-old", "bmc.powerStatus", PowerPayload(Redfish(*bmc)));
  EXPECT_NE(old.find("refused the credential"), std::string::npos) << old;
}

TEST_F(Bmc, RedfishRotateThatCannotLogInAfterwardsSaysSoAndRestores) {
  std::unique_ptr<RedfishBmc> bmc = StartRedfish();
  ASSERT_TRUE(bmc);
  ASSERT_TRUE(bmc->SetFaults({{"refuse_new_password", true}}).ok());
  site::BmcRotatePayload rotate;
  *rotate.mutable_bmc() = Redfish(*bmc);
  rotate.set_new_credential_ref("bmc/new");
  std::string message = Failure("c-rotate", "bmc.rotate", rotate);
  EXPECT_NE(message.find("the new password was set but a login with it failed"), std::string::npos)
      << message;
  EXPECT_NE(message.find("the old password was restored"), std::string::npos) << message;
  ASSERT_TRUE(bmc->SetFaults({{"refuse_new_password", false}}).ok());
  EXPECT_EQ(Power("c-old", "bmc.powerStatus", Redfish(*bmc)).power_state(), "off");
}

TEST_F(Bmc, CommandsOnOneBmcRunOneAtATimeAndBmcsSideBySide) {
  std::unique_ptr<RedfishBmc> a = StartRedfish({"--slow", "0.3"}, "a");
  std::unique_ptr<RedfishBmc> b = StartRedfish({"--slow", "0.3"}, "b");
  ASSERT_TRUE(a && b);
  for (int i = 0; i < 3; ++i) {
    Send("c-a" + std::to_string(i), "bmc.powerStatus", PowerPayload(Redfish(*a)));
    Send("c-b" + std::to_string(i), "bmc.powerStatus", PowerPayload(Redfish(*b)));
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(Wait("c-a" + std::to_string(i)).state(), v1::COMMAND_STATE_SUCCEEDED);
    EXPECT_EQ(Wait("c-b" + std::to_string(i)).state(), v1::COMMAND_STATE_SUCCEEDED);
  }
  // Three commands each, sent at once: each BMC saw one request at a time ...
  nlohmann::json sa = *a->State(), sb = *b->State();
  EXPECT_EQ(sa["max_in_flight"], 1);
  EXPECT_EQ(sb["max_in_flight"], 1);
  // ... while the two BMCs were asked at the same time.
  bool overlapped = false;
  for (const auto& x : sa["log"]) {
    for (const auto& y : sb["log"]) {
      overlapped |= x.value("start", 0.0) < y.value("end", 0.0) &&
                    y.value("start", 0.0) < x.value("end", 0.0);
    }
  }
  EXPECT_TRUE(overlapped);
}

// BMCs started before the agent, so that its [site] table can name them: a Redfish emulator on
// 127.0.0.1:R (TCP) and, where ipmi_sim is installed, an IPMI BMC on 127.0.0.2:R (UDP). The site's
// ports are both R: 127.0.0.1 serves Redfish, 127.0.0.2 only IPMI.
struct SiteBmcs {
  SiteBmcs() {
    absl::StatusOr<std::unique_ptr<RedfishBmc>> r =
        RedfishBmc::Start(dir.path() / "redfish", {.password = kPassword});
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) redfish = *std::move(r);
    absl::StatusOr<std::unique_ptr<RedfishBmc>> o =
        RedfishBmc::Start(dir.path() / "other", {.password = kPassword});
    EXPECT_TRUE(o.ok()) << o.status();
    if (o.ok()) other = *std::move(o);
    if (redfish && testing::HaveIpmiSim()) {
      absl::StatusOr<std::unique_ptr<IpmiBmc>> i =
          IpmiBmc::Start(dir.path() / "ipmi", "admin", kPassword, "127.0.0.2", redfish->port());
      EXPECT_TRUE(i.ok()) << i.status();
      if (i.ok()) ipmi = *std::move(i);
    }
  }
  int port() const { return redfish ? redfish->port() : 1; }
  FakeRoot dir;
  std::unique_ptr<RedfishBmc> redfish, other;
  std::unique_ptr<IpmiBmc> ipmi;
};

class BmcSite : protected SiteBmcs, public Bmc {
 protected:
  // `trust`: the [site] line that says how Redfish certificates are trusted, given the BMCs
  // (started first: SiteBmcs is the first base).
  explicit BmcSite(const std::function<std::string(const SiteBmcs&)>& trust)
      : SiteBmcs(),
        Bmc("[site]\n" + trust(*this) + "\nbmc_redfish_port = " + std::to_string(port()) +
            "\nbmc_ipmi_port = " + std::to_string(port()) + "\n") {}
  using SiteBmcs::ipmi;
  using SiteBmcs::other;
  using SiteBmcs::redfish;

  site::BmcTarget Auto(const std::string& address, const std::string& ref = "bmc/cred") const {
    site::BmcTarget target;
    target.set_address(address);
    target.set_credential_ref(ref);
    return target;
  }
};

class BmcUnverified : public BmcSite {
 protected:
  BmcUnverified()
      : BmcSite([](const SiteBmcs&) { return "bmc_tls_unverified = [\"127.0.0.1\"]"; }) {}
};

TEST_F(BmcUnverified, OnlyAnAddressListedByNameGoesWithoutACertificateCheck) {
  ASSERT_TRUE(redfish);
  site::BmcTarget listed = Auto("127.0.0.1");
  listed.set_protocol(site::BMC_PROTOCOL_REDFISH);
  EXPECT_EQ(Power("c-listed", "bmc.powerStatus", listed).power_state(), "off");
  site::BmcTarget unlisted = Auto("localhost:" + std::to_string(redfish->port()));
  unlisted.set_protocol(site::BMC_PROTOCOL_REDFISH);
  std::string refused = Failure("c-unlisted", "bmc.powerStatus", PowerPayload(unlisted));
  EXPECT_NE(refused.find("BMC localhost:" + std::to_string(redfish->port()) +
                         ": no tls_spki_sha256 pin and no [site] bmc_ca_file: an unverified "
                         "Redfish connection is refused"),
            std::string::npos)
      << refused;
}

class BmcSiteCa : public BmcSite {
 protected:
  BmcSiteCa()
      : BmcSite([](const SiteBmcs& bmcs) {
          return "bmc_ca_file = \"" +
                 (bmcs.redfish ? bmcs.redfish->cert().string() : "/nonexistent") + "\"";
        }) {}
};

TEST_F(BmcSiteCa, ACertificateThatDoesNotChainToTheSiteCaIsRefused) {
  ASSERT_TRUE(redfish && other);
  site::BmcTarget good = Auto("127.0.0.1");
  good.set_protocol(site::BMC_PROTOCOL_REDFISH);
  EXPECT_EQ(Power("c-good", "bmc.powerStatus", good).power_state(), "off");
  site::BmcTarget bad = Auto(other->address());
  bad.set_protocol(site::BMC_PROTOCOL_REDFISH);
  std::string refused = Failure("c-bad", "bmc.powerStatus", PowerPayload(bad));
  EXPECT_NE(refused.find("its certificate does not chain to " + redfish->cert().string()),
            std::string::npos)
      << refused;
}

class BmcAuto : public BmcSite {
 protected:
  BmcAuto()
      : BmcSite([](const SiteBmcs&) {
          return "bmc_tls_unverified = [\"127.0.0.1\", \"127.0.0.2\"]";
        }) {}
};

TEST_F(BmcAuto, RedfishWhereItIsServedIpmiWhereItIsNotAndNoFallbackOnARefusedCredential) {
  if (!testing::HaveIpmiSim()) GTEST_SKIP() << "ipmi_sim and ipmitool are not installed";
  ASSERT_TRUE(redfish && ipmi);
  EXPECT_EQ(Power("c-redfish", "bmc.powerStatus", Auto("127.0.0.1")).protocol(),
            site::BMC_PROTOCOL_REDFISH);
  site::BmcPowerResult fallback = Power("c-ipmi", "bmc.powerOn", Auto("127.0.0.2"));
  EXPECT_EQ(fallback.protocol(), site::BMC_PROTOCOL_IPMI);
  EXPECT_EQ(fallback.power_state(), "on");
  EXPECT_EQ(ipmi->Power(), "on");
  std::size_t calls = ipmi->Calls().size();
  std::string wrong =
      Failure("c-wrong", "bmc.powerStatus", PowerPayload(Auto("127.0.0.1", "bmc/wrong")));
  EXPECT_NE(wrong.find("the BMC refused the credential"), std::string::npos) << wrong;
  EXPECT_EQ(wrong.find("IPMI"), std::string::npos) << wrong;
  EXPECT_EQ(ipmi->Calls().size(), calls);
}

// The emulator is not a server that only agrees with bcd: sushy and redfishtool drive it through
// power, the boot override and a password change (tests/interop/redfish_clients.py), and what
// they did is what the emulator holds.
TEST(RedfishEmulator, SushyAndRedfishtoolDriveItThroughPowerBootAndAccounts) {
  FakeRoot dir;
  absl::StatusOr<std::unique_ptr<RedfishBmc>> bmc = RedfishBmc::Start(
      dir.path() / "bmc",
      {.password = kPassword, .args = {"--require-etag", "--power-delay", "0.2"}});
  ASSERT_TRUE(bmc.ok()) << bmc.status();
  absl::StatusOr<ToolRun> run = RunTool(
      {"/usr/bin/python3", BCD_SOURCE_DIR "/tests/interop/redfish_clients.py",
       std::to_string((*bmc)->port()), (*bmc)->cert().string(), "admin", kPassword, kNewPassword},
      {}, std::chrono::seconds(120));
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->exit_code, 0) << run->output;
  nlohmann::json seen = nlohmann::json::parse(run->output, nullptr, false);
  ASSERT_TRUE(seen.is_object()) << run->output;
  EXPECT_EQ(seen["sushy_systems"], nlohmann::json::array({"1"}));
  EXPECT_EQ(seen["sushy_power_before"], "Off");
  EXPECT_EQ(seen["sushy_power_after_on"], "On");
  EXPECT_EQ(seen["sushy_boot"], nlohmann::json::array({"Pxe", "Continuous", "UEFI"}));
  EXPECT_EQ(seen["redfishtool_power_after_off"], "Off");
  EXPECT_EQ(seen["redfishtool_boot"], nlohmann::json::array({"Hdd", "Once"}));
  EXPECT_EQ(seen["redfishtool_login_with_new_password"], "Off");
  nlohmann::json state = *(*bmc)->State();
  EXPECT_EQ(state["systems"]["1"]["power"], "Off");
  EXPECT_EQ(state["systems"]["1"]["boot"]["BootSourceOverrideTarget"], "Hdd");
  EXPECT_EQ(state["accounts"]["admin"]["changed"], true);
  // Both clients sent If-Match on their PATCHes (the emulator requires it): none was refused.
  int patches = 0;
  for (const auto& entry : state["log"]) patches += entry["method"] == "PATCH";
  EXPECT_EQ(patches, 3);
}

// --- IPMI ---

class IpmiBmcTest : public Bmc {
 protected:
  void SetUp() override {
    if (!testing::HaveIpmiSim()) GTEST_SKIP() << "ipmi_sim and ipmitool are not installed";
    absl::StatusOr<std::unique_ptr<IpmiBmc>> bmc =
        IpmiBmc::Start(bmcs_.path() / "ipmi", "admin", kPassword);
    ASSERT_TRUE(bmc.ok()) << bmc.status();
    ipmi_ = *std::move(bmc);
  }
  std::unique_ptr<IpmiBmc> ipmi_;
};

TEST_F(IpmiBmcTest, PowerAndBootDeviceOverIpmitool) {
  site::BmcTarget target = Ipmi(*ipmi_);
  site::BmcPowerResult status = Power("c-status", "bmc.powerStatus", target);
  EXPECT_EQ(status.power_state(), "off");
  EXPECT_EQ(status.protocol(), site::BMC_PROTOCOL_IPMI);
  EXPECT_EQ(Power("c-on", "bmc.powerOn", target).power_state(), "on");
  EXPECT_EQ(ipmi_->Power(), "on");
  EXPECT_EQ(Power("c-cycle", "bmc.powerCycle", target).power_state(), "on");
  EXPECT_EQ(Power("c-off", "bmc.powerOff", target).power_state(), "off");
  EXPECT_EQ(ipmi_->Power(), "off");
  v1::CommandUpdate boot =
      Run("c-boot", "bmc.setBootDevice", BootPayload(target, "pxe", true, true));
  ASSERT_EQ(boot.state(), v1::COMMAND_STATE_SUCCEEDED) << boot.message();
  site::BmcSetBootDeviceResult result;
  ASSERT_TRUE(result.ParseFromString(boot.result()));
  EXPECT_EQ(result.device(), "pxe");
  EXPECT_EQ(ipmi_->Boot(), "pxe");
  std::vector<std::string> calls = ipmi_->Calls();
  EXPECT_NE(std::find(calls.begin(), calls.end(), "set power 1"), calls.end());
  EXPECT_NE(std::find(calls.begin(), calls.end(), "set power 0"), calls.end());
}

// The command lines of this process's children (what bcd, running in this test, started:
// ipmitool among them) that hold `needle`, and how many of them were ipmitool. Other processes
// are not looked at: a test running beside this one may pass the same password on purpose.
struct Sweep {
  std::atomic<int> ipmitools{0};
  std::atomic<int> leaks{0};
};
pid_t ParentOf(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::size_t close = stat.rfind(')');  // the name may hold spaces and parentheses
  if (close == std::string::npos) return -1;
  std::istringstream rest(stat.substr(close + 1));
  std::string state;
  pid_t parent = -1;
  rest >> state >> parent;
  return parent;
}
void SweepProc(const std::string& needle, Sweep* sweep) {
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return;
  while (dirent* entry = readdir(proc)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    if (ParentOf(entry->d_name) != getpid()) continue;
    std::ifstream in(std::string("/proc/") + entry->d_name + "/cmdline", std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    std::string cmdline = text.str();
    if (cmdline.find("ipmitool") != std::string::npos) ++sweep->ipmitools;
    if (cmdline.find(needle) != std::string::npos) ++sweep->leaks;
  }
  closedir(proc);
}

TEST_F(IpmiBmcTest, NoPasswordOnACommandLineOrLeftInAFileAndRotateVerifies) {
  Sweep old_sweep, new_sweep;
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    while (!done) {
      SweepProc(kPassword, &old_sweep);
      SweepProc(kNewPassword, &new_sweep);
    }
  });
  site::BmcTarget target = Ipmi(*ipmi_);
  Power("c-status", "bmc.powerStatus", target);
  site::BmcRotatePayload rotate;
  *rotate.mutable_bmc() = target;
  rotate.set_new_credential_ref("bmc/new");
  v1::CommandUpdate update = Run("c-rotate", "bmc.rotate", rotate);
  done = true;
  watcher.join();
  ASSERT_EQ(update.state(), v1::COMMAND_STATE_SUCCEEDED) << update.message();
  site::BmcRotateResult result;
  ASSERT_TRUE(result.ParseFromString(update.result()));
  EXPECT_TRUE(result.verified());
  EXPECT_GT(old_sweep.ipmitools, 0) << "the sweep never saw ipmitool run: it proved nothing";
  EXPECT_EQ(old_sweep.leaks, 0);
  EXPECT_EQ(new_sweep.leaks, 0);
  // The file the new password went through is gone.
  std::filesystem::path work = node_->config->state_dir() / "bmc";
  EXPECT_TRUE(std::filesystem::is_empty(work));
  EXPECT_EQ(Power("c-new", "bmc.powerStatus", Ipmi(*ipmi_, "bmc/new")).power_state(), "off");
  std::string old = Failure("c-old", "bmc.powerStatus", PowerPayload(target));
  EXPECT_NE(old.find("the BMC refused the credential of admin"), std::string::npos) << old;
}

TEST_F(IpmiBmcTest, AWrongCredentialAndAnUnreachableBmcAreFailuresThatSayWhich) {
  std::string wrong =
      Failure("c-wrong", "bmc.powerStatus", PowerPayload(Ipmi(*ipmi_, "bmc/wrong")));
  EXPECT_NE(wrong.find("BMC 127.0.0.1:" + std::to_string(ipmi_->port()) +
                       " (IPMI): the BMC refused the credential of admin"),
            std::string::npos)
      << wrong;
  site::BmcTarget nowhere = Ipmi(*ipmi_);
  nowhere.set_address("127.0.0.1:9");  // discard: nothing answers
  std::string unreachable = Failure("c-nowhere", "bmc.powerStatus", PowerPayload(nowhere));
  EXPECT_NE(unreachable.find("BMC 127.0.0.1:9 (IPMI): no IPMI session: no answer"),
            std::string::npos)
      << unreachable;
}

}  // namespace
}  // namespace bcd
