// Arbitrary answers from a BMC. The first byte picks the protocol; the rest, split at "\n--\n",
// is what the BMC answers, in order: for Redfish a status line then a body (JSON or not), for
// IPMI what ipmitool printed. A session is opened and every operation tried on it; none may crash,
// hang or throw, whatever the BMC says.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "modes/site/bmc.h"

namespace {

std::vector<std::string> Split(std::string_view bytes) {
  std::vector<std::string> parts;
  for (;;) {
    std::size_t at = bytes.find("\n--\n");
    parts.emplace_back(bytes.substr(0, at));
    if (at == std::string_view::npos) return parts;
    bytes.remove_prefix(at + 4);
  }
}

void Exercise(bcd::BmcSession& session, const bcd::BmcEndpoint& endpoint) {
  (void)session.PowerState();
  (void)session.Power(bcd::PowerAction::kCycle);
  (void)session.Power(bcd::PowerAction::kOff);
  (void)bcd::WaitForPower(session, endpoint, "off");
  (void)session.SetBoot({.device = "pxe", .persistent = true, .uefi = true});
  (void)session.BootDevice();
  (void)session.SetPassword("n3w-password");
  session.Close();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::vector<std::string> answers = Split(bytes);
  std::size_t next = 0;
  bcd::BmcEndpoint endpoint{.host = "bmc.test",
                            .port = 443,
                            .user = "admin",
                            .password = "pw",
                            .deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5),
                            .poll_interval = std::chrono::milliseconds(0)};
  if (data[0] % 2 == 0) {
    endpoint.trust.unverified = true;
    endpoint.exchange = [&](const bcd::DeviceRequest&) -> absl::StatusOr<bcd::DeviceAnswer> {
      if (next >= answers.size()) return absl::UnavailableError("bmc.test: no more answers");
      const std::string& answer = answers[next++];
      std::size_t line = answer.find('\n');
      bcd::DeviceAnswer a;
      a.status = static_cast<unsigned>(std::atoi(answer.substr(0, line).c_str()));
      a.body = line == std::string::npos ? "" : answer.substr(line + 1);
      a.headers = {{"x-auth-token", "t"},
                   {"location", "/redfish/v1/SessionService/Sessions/1"},
                   {"etag", "W/\"1\""}};
      return a;
    };
    absl::StatusOr<std::unique_ptr<bcd::BmcSession>> session = bcd::OpenRedfish(endpoint);
    if (session.ok()) Exercise(**session, endpoint);
  } else {
    bcd::IpmiOptions options{.work_dir = "/nonexistent"};
    options.run = [&](const std::vector<std::string>&, const std::vector<std::string>&,
                      std::chrono::milliseconds,
                      const std::atomic<bool>*) -> absl::StatusOr<bcd::ToolRun> {
      if (next >= answers.size()) return absl::DeadlineExceededError("ipmitool: ran too long");
      return bcd::ToolRun{.exit_code = 0, .output = answers[next++]};
    };
    endpoint.port = 623;
    absl::StatusOr<std::unique_ptr<bcd::BmcSession>> session = bcd::OpenIpmi(endpoint, options);
    if (session.ok()) Exercise(**session, endpoint);
  }
  return 0;
}
