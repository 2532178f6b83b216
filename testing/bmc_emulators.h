#pragma once

// BMCs for the site agent's tests and the dev stack, real software on loopback:
//  - RedfishBmc runs testing/bmc/redfish_bmc.py (HTTPS, its own certificate, sessions, ETags,
//    faults on demand; see the script's header), read back through its /emulator routes;
//  - IpmiBmc runs Debian's ipmi_sim (openipmi) with a lan.conf and a chassis_control script that
//    keeps power and the boot device in files, for ipmitool to drive over lanplus.
// Each stops (its process killed) when the object goes.

#include <sys/types.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace bcd::testing {

class RedfishBmc {
 public:
  struct Options {
    std::string user = "admin";
    std::string password = "secret";
    std::string host = "127.0.0.1";
    int port = 0;                   // 0: any free one
    std::vector<std::string> args;  // more flags (--no-sessions, --reset-types ..., --slow 2)
  };
  // Starts it with its files in `dir` (created); ready when this returns.
  static absl::StatusOr<std::unique_ptr<RedfishBmc>> Start(const std::filesystem::path& dir,
                                                           Options options);
  ~RedfishBmc();

  int port() const { return port_; }
  std::string address() const { return host_ + ":" + std::to_string(port_); }
  const std::string& spki_sha256() const { return spki_; }  // 32 bytes
  const std::string& spki_sha256_hex() const { return spki_hex_; }
  const std::filesystem::path& cert() const { return cert_; }
  pid_t pid() const { return pid_; }

  // GET /emulator/state: systems (power, boot), sessions open, accounts, the request log.
  absl::StatusOr<nlohmann::json> State() const;
  // PATCH /emulator/faults.
  absl::Status SetFaults(const nlohmann::json& faults) const;

 private:
  RedfishBmc() = default;
  absl::StatusOr<nlohmann::json> Ask(const std::string& method, const std::string& path,
                                     const std::string& body) const;
  pid_t pid_ = -1;
  std::string host_;
  int port_ = 0;
  std::string spki_, spki_hex_;
  std::filesystem::path cert_;
};

class IpmiBmc {
 public:
  // ipmi_sim on host:port (0: a free one) with user 2 `user`/`password` (admin), files in `dir`.
  static absl::StatusOr<std::unique_ptr<IpmiBmc>> Start(const std::filesystem::path& dir,
                                                        const std::string& user,
                                                        const std::string& password,
                                                        const std::string& host = "127.0.0.1",
                                                        int port = 0);
  ~IpmiBmc();

  int port() const { return port_; }
  std::string address() const { return host_ + ":" + std::to_string(port_); }
  pid_t pid() const { return pid_; }
  // "on" or "off", and the boot device ipmi_sim last set ("default" before any): its files.
  std::string Power() const;
  std::string Boot() const;
  // Every call ipmi_sim made to the chassis script ("get power", "set boot pxe", ...).
  std::vector<std::string> Calls() const;

 private:
  IpmiBmc() = default;
  pid_t pid_ = -1;
  std::string host_;
  int port_ = 0;
  std::filesystem::path dir_;
};

// Whether ipmi_sim and ipmitool are installed (the IPMI tests say so and skip when not).
bool HaveIpmiSim();

}  // namespace bcd::testing
