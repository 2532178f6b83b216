#pragma once

// A BMC as the site agent's kinds see it, whatever protocol reaches it: one Session per command,
// opened with the BMC's credential (a secret fetched for that command, held in memory only), used
// for a few operations, closed. Redfish (bmc_redfish.cc) and IPMI through ipmitool (bmc_ipmi.cc)
// implement it; bmc_kinds.cc picks one and runs the bmc.* kinds over it.
//
// Errors say which BMC and why, in codes the kinds act on:
//   Unimplemented       the protocol is not served there (AUTO then tries IPMI)
//   Unavailable         no answer, a refused connection, a timeout
//   Unauthenticated     the BMC refused the credential
//   PermissionDenied    its TLS certificate is not the one trusted
//   NotFound            no such system
//   FailedPrecondition  the BMC does not offer what was asked (a boot device, a reset type)
//   Cancelled           the command was cancelled or ran out of time

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/subprocess.h"
#include "transport/http_client.h"

namespace bcd {

enum class PowerAction { kOn, kOff, kCycle };

// Where a BMC is and what to log in with, for one command.
struct BmcEndpoint {
  std::string host;   // name or IP, IPv6 without brackets
  uint16_t port = 0;  // the protocol's port
  std::string user;
  std::string password;
  std::string system_id;  // Redfish: the ComputerSystem's Id; empty takes the first
  DeviceTrust trust;      // Redfish: how its certificate is trusted
  std::chrono::steady_clock::time_point deadline;  // the command's
  const std::atomic<bool>* stop = nullptr;         // turns true on cancel or timeout
  // How long each exchange may take at most (always within `deadline`).
  std::chrono::milliseconds exchange_timeout{std::chrono::seconds(20)};
  // How often WaitForPower asks while the state has not followed.
  std::chrono::milliseconds poll_interval{250};
  // Redfish: how a request reaches the BMC; HttpDeviceExchange when unset (the fuzz target
  // answers with its own bytes).
  std::function<absl::StatusOr<DeviceAnswer>(const DeviceRequest&)> exchange;
};

// The boot device asked for: pxe, disk, cdrom or bios.
struct BootChoice {
  std::string device;
  bool persistent = false;
  bool uefi = false;
};

class BmcSession {
 public:
  virtual ~BmcSession() = default;
  // "on", "off", or what the BMC says meanwhile ("powering-on", "powering-off").
  virtual absl::StatusOr<std::string> PowerState() = 0;
  // Asks for the action; does not wait for the state to follow (see WaitForPower).
  virtual absl::Status Power(PowerAction action) = 0;
  virtual absl::Status SetBoot(const BootChoice& choice) = 0;
  // The boot device the BMC reports: pxe, disk, cdrom, bios, none (no override) or its own word.
  virtual absl::StatusOr<std::string> BootDevice() = 0;
  // Sets the password of the user logged in as.
  virtual absl::Status SetPassword(const std::string& password) = 0;
  // Logs out (deletes a Redfish session). Best effort, never fails the command.
  virtual void Close() = 0;
};

// Redfish over HTTPS: the service root, a session (SessionService; basic auth where sessions are
// not offered), the ComputerSystem by id.
absl::StatusOr<std::unique_ptr<BmcSession>> OpenRedfish(const BmcEndpoint& endpoint);

// The cipher suite each BMC took last ("host:port" to "17" or "3"), so that a BMC that refuses 17
// is not asked for it again by every command. Thread-safe.
class IpmiSuites {
 public:
  std::string For(const std::string& bmc) const;  // "" when none is known
  void Remember(const std::string& bmc, const std::string& suite);

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::string> suites_;
};

// IPMI over LAN (lanplus) through ipmitool: the password by environment, cipher suite 17, then 3.
struct IpmiOptions {
  std::string ipmitool = "ipmitool";
  std::filesystem::path work_dir;  // 0700: the file a new password goes through, removed at once
  std::shared_ptr<IpmiSuites> suites;  // may be null: every session finds its suite again
  // How ipmitool is run; RunTool when unset (the fuzz target answers with its own words).
  std::function<absl::StatusOr<ToolRun>(
      const std::vector<std::string>& argv, const std::vector<std::string>& env,
      std::chrono::milliseconds timeout, const std::atomic<bool>* stop)>
      run;
};
absl::StatusOr<std::unique_ptr<BmcSession>> OpenIpmi(const BmcEndpoint& endpoint,
                                                     const IpmiOptions& options);

// Polls the power state until it is `want` ("on"/"off") or the deadline; the last state read.
absl::StatusOr<std::string> WaitForPower(BmcSession& session, const BmcEndpoint& endpoint,
                                         const std::string& want);

}  // namespace bcd
