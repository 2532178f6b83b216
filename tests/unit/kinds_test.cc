#include "proto/kinds.h"

#include <set>

#include "bettercompute/agent/v1/session.pb.h"
#include "bettercompute/driver/v1/driver.pb.h"
#include "bettercompute/site/v1/site.pb.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"

namespace bcd::proto {
namespace {

using std::chrono::seconds;

// The product's table, written out independently of kinds.cc: name, modes, lane, timeout (s),
// flags.
struct Row {
  std::string_view name;
  std::string_view modes;
  std::string_view lane;
  int64_t timeout;
  uint32_t flags;
};

constexpr Row kExpected[] = {
    {"inventory.refresh", "node,site,ramdisk", "control", 60, kIdempotent},
    {"logs.collect", "node,site", "bulk", 600, kSigned | kIdempotent},
    {"node.reboot", "node", "power", 300, kSigned | kQuorum},
    {"daemon.upgrade", "node,site,ramdisk", "exclusive", 600, kSigned | kUpgradeOk},
    {"driver.invoke", "node", "driver", 0, kSigned | kTimeoutFromPayload},
    {"bmc.powerOn", "site", "per-bmc", 120, kSigned},
    {"bmc.powerOff", "site", "per-bmc", 120, kSigned | kQuorum},
    {"bmc.powerCycle", "site", "per-bmc", 120, kSigned | kQuorum},
    {"bmc.powerStatus", "site", "per-bmc", 120, kSigned | kIdempotent},
    {"bmc.setBootDevice", "site", "per-bmc", 120, kSigned},
    {"bmc.rotate", "site", "per-bmc", 120, kSigned},
    {"site.httpProxy", "site", "control", 30, kSigned},
    {"boot.prepareRamdisk", "site", "control", 60, kSigned},
    {"boot.cleanUp", "site", "control", 60, kSigned},
    {"diag.dcgm", "ramdisk", "diag", 3600, 0},
    {"disk.wipe", "ramdisk", "disk", 21600, kSigned | kQuorum},
    {"deploy.image", "ramdisk", "disk", 7200, kSigned | kQuorum},
    {"boot.kexec", "ramdisk", "power", 300, kSigned | kQuorum},
};

std::string ModesOf(const KindSpec& kind) {
  std::string out;
  for (Mode mode : {Mode::kNode, Mode::kSite, Mode::kRamdisk}) {
    if (!kind.RunsIn(mode)) continue;
    if (!out.empty()) out += ",";
    out += ModeName(mode);
  }
  return out;
}

TEST(KindTable, MatchesTheProductTableRowForRow) {
  ASSERT_EQ(AllKinds().size(), std::size(kExpected));
  for (std::size_t i = 0; i < std::size(kExpected); ++i) {
    const Row& row = kExpected[i];
    const KindSpec& kind = AllKinds()[i];
    SCOPED_TRACE(row.name);
    EXPECT_EQ(kind.name, row.name);
    EXPECT_EQ(ModesOf(kind), row.modes);
    EXPECT_EQ(LaneName(kind.lane), row.lane);
    EXPECT_EQ(kind.timeout, seconds(row.timeout));
    EXPECT_EQ(kind.flags, row.flags);
  }
}

TEST(KindTable, EveryPayloadAndResultTypeExists) {
  // Keep the generated files of all four packages linked.
  bettercompute::agent::v1::AgentFrame agent;
  bettercompute::site::v1::BmcPowerPayload site;
  bettercompute::driver::v1::DriverInvokePayload driver;
  const auto* pool = google::protobuf::DescriptorPool::generated_pool();
  for (const KindSpec& kind : AllKinds()) {
    EXPECT_NE(pool->FindMessageTypeByName(std::string(kind.payload_type)), nullptr)
        << kind.payload_type;
    EXPECT_NE(pool->FindMessageTypeByName(std::string(kind.result_type)), nullptr)
        << kind.result_type;
  }
}

TEST(KindTable, FindsKindsByName) {
  ASSERT_NE(FindKind("disk.wipe"), nullptr);
  EXPECT_TRUE(FindKind("disk.wipe")->Has(kQuorum));
  EXPECT_EQ(FindKind("disk.format"), nullptr);
  EXPECT_EQ(FindKind(""), nullptr);
  EXPECT_EQ(FindKind("DISK.WIPE"), nullptr);
}

TEST(KindTable, ListsTheKindsOfEachMode) {
  auto names = [](Mode mode) {
    std::vector<std::string_view> out;
    for (const KindSpec* kind : KindsForMode(mode)) out.push_back(kind->name);
    return out;
  };
  EXPECT_THAT(names(Mode::kNode),
              ::testing::ElementsAre("inventory.refresh", "logs.collect", "node.reboot",
                                     "daemon.upgrade", "driver.invoke"));
  EXPECT_THAT(names(Mode::kRamdisk),
              ::testing::ElementsAre("inventory.refresh", "daemon.upgrade", "diag.dcgm",
                                     "disk.wipe", "deploy.image", "boot.kexec"));
  EXPECT_EQ(names(Mode::kSite).size(), 12u);
}

TEST(KindTable, InvariantsHold) {
  std::set<std::string_view> names;
  for (const KindSpec& kind : AllKinds()) {
    EXPECT_TRUE(names.insert(kind.name).second) << "duplicate " << kind.name;
    EXPECT_TRUE(!kind.Has(kQuorum) || kind.Has(kSigned)) << kind.name << ": quorum without signed";
    EXPECT_EQ(kind.Has(kUpgradeOk), kind.name == "daemon.upgrade") << kind.name;
    EXPECT_EQ(kind.timeout == seconds(0), kind.Has(kTimeoutFromPayload)) << kind.name;
    EXPECT_NE(kind.modes, 0) << kind.name;
  }
}

TEST(Mode, ParsesAndNamesModes) {
  EXPECT_EQ(ParseMode("site"), Mode::kSite);
  EXPECT_EQ(ParseMode("Site"), std::nullopt);
  EXPECT_EQ(ModeName(Mode::kRamdisk), "ramdisk");
}

}  // namespace
}  // namespace bcd::proto
