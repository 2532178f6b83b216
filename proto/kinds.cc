#include "proto/kinds.h"

#include <array>

namespace bcd::proto {
namespace {

using std::chrono::hours;
using std::chrono::minutes;
using std::chrono::seconds;

constexpr uint8_t kNodeM = static_cast<uint8_t>(Mode::kNode);
constexpr uint8_t kSiteM = static_cast<uint8_t>(Mode::kSite);
constexpr uint8_t kRamdiskM = static_cast<uint8_t>(Mode::kRamdisk);
constexpr uint8_t kAllModes = kNodeM | kSiteM | kRamdiskM;

#define BCD_AGENT(name) "bettercompute.agent.v1." name
#define BCD_SITE(name) "bettercompute.site.v1." name
#define BCD_DRIVER(name) "bettercompute.driver.v1." name

constexpr std::array kKinds = {
    KindSpec{"inventory.refresh", kAllModes, Lane::kControl, seconds(60), kIdempotent,
             BCD_AGENT("InventoryRefreshPayload"), BCD_AGENT("InventoryRefreshResult")},
    KindSpec{"logs.collect", kNodeM | kSiteM, Lane::kBulk, minutes(10), kSigned | kIdempotent,
             BCD_AGENT("LogsCollectPayload"), BCD_AGENT("LogsCollectResult")},
    KindSpec{"node.reboot", kNodeM, Lane::kPower, minutes(5), kSigned | kQuorum,
             BCD_AGENT("NodeRebootPayload"), BCD_AGENT("NodeRebootResult")},
    KindSpec{"daemon.upgrade", kAllModes, Lane::kExclusive, minutes(10), kSigned | kUpgradeOk,
             BCD_AGENT("DaemonUpgradePayload"), BCD_AGENT("DaemonUpgradeResult")},
    KindSpec{"driver.invoke", kNodeM, Lane::kDriver, seconds(0), kSigned | kTimeoutFromPayload,
             BCD_DRIVER("DriverInvokePayload"), BCD_DRIVER("DriverInvokeResult")},
    KindSpec{"bmc.powerOn", kSiteM, Lane::kPerBmc, minutes(2), kSigned, BCD_SITE("BmcPowerPayload"),
             BCD_SITE("BmcPowerResult")},
    KindSpec{"bmc.powerOff", kSiteM, Lane::kPerBmc, minutes(2), kSigned | kQuorum,
             BCD_SITE("BmcPowerPayload"), BCD_SITE("BmcPowerResult")},
    KindSpec{"bmc.powerCycle", kSiteM, Lane::kPerBmc, minutes(2), kSigned | kQuorum,
             BCD_SITE("BmcPowerPayload"), BCD_SITE("BmcPowerResult")},
    KindSpec{"bmc.powerStatus", kSiteM, Lane::kPerBmc, minutes(2), kSigned | kIdempotent,
             BCD_SITE("BmcPowerPayload"), BCD_SITE("BmcPowerResult")},
    KindSpec{"bmc.setBootDevice", kSiteM, Lane::kPerBmc, minutes(2), kSigned,
             BCD_SITE("BmcSetBootDevicePayload"), BCD_SITE("BmcSetBootDeviceResult")},
    KindSpec{"bmc.rotate", kSiteM, Lane::kPerBmc, minutes(2), kSigned, BCD_SITE("BmcRotatePayload"),
             BCD_SITE("BmcRotateResult")},
    KindSpec{"site.httpProxy", kSiteM, Lane::kControl, seconds(30), kSigned,
             BCD_SITE("HttpProxyPayload"), BCD_SITE("HttpProxyResult")},
    KindSpec{"boot.prepareRamdisk", kSiteM, Lane::kControl, seconds(60), kSigned,
             BCD_SITE("PrepareRamdiskPayload"), BCD_SITE("PrepareRamdiskResult")},
    KindSpec{"boot.cleanUp", kSiteM, Lane::kControl, seconds(60), kSigned,
             BCD_SITE("BootCleanUpPayload"), BCD_SITE("BootCleanUpResult")},
    KindSpec{"diag.dcgm", kRamdiskM, Lane::kDiag, minutes(60), 0, BCD_AGENT("DiagDcgmPayload"),
             BCD_AGENT("DiagDcgmResult")},
    KindSpec{"disk.wipe", kRamdiskM, Lane::kDisk, hours(6), kSigned | kQuorum,
             BCD_AGENT("DiskWipePayload"), BCD_AGENT("DiskWipeResult")},
    KindSpec{"deploy.image", kRamdiskM, Lane::kDisk, hours(2), kSigned | kQuorum,
             BCD_AGENT("DeployImagePayload"), BCD_AGENT("DeployImageResult")},
    KindSpec{"boot.kexec", kRamdiskM, Lane::kPower, minutes(5), kSigned | kQuorum,
             BCD_AGENT("BootKexecPayload"), BCD_AGENT("BootKexecResult")},
};

#undef BCD_AGENT
#undef BCD_SITE
#undef BCD_DRIVER

}  // namespace

std::string_view ModeName(Mode mode) {
  switch (mode) {
    case Mode::kNode:
      return "node";
    case Mode::kSite:
      return "site";
    case Mode::kRamdisk:
      return "ramdisk";
  }
  return "node";
}

std::optional<Mode> ParseMode(std::string_view name) {
  for (Mode mode : {Mode::kNode, Mode::kSite, Mode::kRamdisk}) {
    if (ModeName(mode) == name) return mode;
  }
  return std::nullopt;
}

std::string_view LaneName(Lane lane) {
  switch (lane) {
    case Lane::kControl:
      return "control";
    case Lane::kBulk:
      return "bulk";
    case Lane::kPower:
      return "power";
    case Lane::kExclusive:
      return "exclusive";
    case Lane::kDriver:
      return "driver";
    case Lane::kPerBmc:
      return "per-bmc";
    case Lane::kDiag:
      return "diag";
    case Lane::kDisk:
      return "disk";
  }
  return "control";
}

std::span<const KindSpec> AllKinds() { return kKinds; }

const KindSpec* FindKind(std::string_view name) {
  for (const KindSpec& kind : kKinds) {
    if (kind.name == name) return &kind;
  }
  return nullptr;
}

std::vector<const KindSpec*> KindsForMode(Mode mode) {
  std::vector<const KindSpec*> out;
  for (const KindSpec& kind : kKinds) {
    if (kind.RunsIn(mode)) out.push_back(&kind);
  }
  return out;
}

bool IsTerminal(bettercompute::agent::v1::CommandState state) {
  namespace v1 = bettercompute::agent::v1;
  return state == v1::COMMAND_STATE_SUCCEEDED || state == v1::COMMAND_STATE_FAILED ||
         state == v1::COMMAND_STATE_REJECTED || state == v1::COMMAND_STATE_TIMED_OUT ||
         state == v1::COMMAND_STATE_CANCELLED;
}

}  // namespace bcd::proto
