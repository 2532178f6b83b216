// IPMI over LAN (lanplus) as a BmcSession, through Debian's ipmitool. The password reaches
// ipmitool through its environment (-E, IPMI_PASSWORD), never its command line; a new password
// goes through a 0600 file of ipmitool commands (exec) in a 0700 directory, removed as soon as
// ipmitool has run. Cipher suite 17 (HMAC-SHA256, AES) is asked for first, 3 (HMAC-SHA1, AES)
// when the BMC refuses it; each call is bounded in time (-N 1 -R 2, and a kill past 15 s).
// ipmitool reports many failures in words with exit status 0: its output is read for them.

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <optional>
#include <vector>

#include "absl/strings/match.h"
#include "base/fd.h"
#include "base/subprocess.h"
#include "fmt/format.h"
#include "modes/site/bmc.h"
#include "proto/absl_compat.h"

namespace bcd {
namespace {

using Clock = std::chrono::steady_clock;

// ipmitool's words for boot devices (chassis bootdev) and what bootparam 5 prints for them.
constexpr std::pair<const char*, const char*> kBootSelectors[] = {
    {"pxe", "Force PXE"},
    {"disk", "Force Boot from default Hard-Drive"},
    {"cdrom", "Force Boot from CD/DVD"},
    {"bios", "Force Boot into BIOS Setup"},
    {"none", "No override"},
};

class IpmiSession final : public BmcSession {
 public:
  IpmiSession(BmcEndpoint endpoint, IpmiOptions options)
      : e_(std::move(endpoint)), options_(std::move(options)) {}

  // A first call logs in: it finds the cipher suite (the one this BMC took last, else 17, then
  // 3) and checks the credential. What it read is the first PowerState's answer.
  absl::Status Open() {
    std::string bmc = fmt::format("{}:{}", e_.host, e_.port);
    std::vector<std::string> suites = {"17", "3"};
    if (options_.suites) {
      std::string known = options_.suites->For(bmc);
      if (known == "3") suites = {"3", "17"};
    }
    for (const std::string& suite : suites) {
      cipher_ = suite;
      absl::StatusOr<std::string> out = Call({"chassis", "power", "status"});
      if (out.ok()) {
        if (options_.suites) options_.suites->Remember(bmc, suite);
        first_status_ = *std::move(out);
        return absl::OkStatus();
      }
      if (!cipher_refused_) return out.status();
    }
    return absl::FailedPreconditionError(
        fmt::format("{}: the BMC refuses cipher suites 17 and 3", Where()));
  }

  absl::StatusOr<std::string> PowerState() override {
    absl::StatusOr<std::string> out;
    if (first_status_) {
      out = *std::exchange(first_status_, std::nullopt);
    } else {
      out = Call({"chassis", "power", "status"});
    }
    if (!out.ok()) return out.status();
    if (absl::StrContains(*out, "Chassis Power is on")) return std::string("on");
    if (absl::StrContains(*out, "Chassis Power is off")) return std::string("off");
    return absl::UnavailableError(
        fmt::format("{}: no power state in ipmitool's answer: {}", Where(), Tail(*out)));
  }

  absl::Status Power(PowerAction action) override {
    const char* word = action == PowerAction::kOn    ? "on"
                       : action == PowerAction::kOff ? "off"
                                                     : "cycle";
    absl::StatusOr<std::string> out = Call({"chassis", "power", word});
    if (!out.ok()) return out.status();
    if (absl::StrContains(*out, "Chassis Power Control:")) return absl::OkStatus();
    if (action == PowerAction::kCycle) {
      // A BMC without a cycle: off, then on once it says off.
      if (absl::Status s = Power(PowerAction::kOff); !s.ok()) return s;
      absl::StatusOr<std::string> off = WaitForPower(*this, e_, "off");
      if (!off.ok()) return off.status();
      return Power(PowerAction::kOn);
    }
    return absl::FailedPreconditionError(
        fmt::format("{}: chassis power {} failed: {}", Where(), word, Tail(*out)));
  }

  absl::Status SetBoot(const BootChoice& choice) override {
    std::vector<std::string> args = {"chassis", "bootdev",
                                     choice.device == "disk" ? "disk" : choice.device};
    std::string options;
    if (choice.persistent) options = "persistent";
    if (choice.uefi) options += options.empty() ? "efiboot" : ",efiboot";
    if (!options.empty()) args.push_back("options=" + options);
    absl::StatusOr<std::string> out = Call(args);
    if (!out.ok()) return out.status();
    if (absl::StrContains(*out, "Set Boot Device to") && !absl::StrContains(*out, "failed"))
      return absl::OkStatus();
    return absl::FailedPreconditionError(fmt::format("{}: the BMC did not take boot device {}: {}",
                                                     Where(), choice.device, Tail(*out)));
  }

  absl::StatusOr<std::string> BootDevice() override {
    absl::StatusOr<std::string> out = Call({"chassis", "bootparam", "get", "5"});
    if (!out.ok()) return out.status();
    std::size_t at = out->find("Boot Device Selector : ");
    if (at == std::string::npos) {
      return absl::UnavailableError(
          fmt::format("{}: no boot device in ipmitool's answer: {}", Where(), Tail(*out)));
    }
    std::string selector = out->substr(at + 23, out->find('\n', at) - at - 23);
    while (!selector.empty() && std::isspace(static_cast<unsigned char>(selector.back())))
      selector.pop_back();
    for (const auto& [ours, theirs] : kBootSelectors) {
      if (selector == theirs) return std::string(ours);
    }
    return selector;
  }

  absl::Status SetPassword(const std::string& password) override {
    if (password.size() > 20) {
      return absl::InvalidArgumentError(
          fmt::format("{}: an IPMI password is at most 20 bytes, the new one has {}", Where(),
                      password.size()));
    }
    for (char c : password) {
      if (static_cast<unsigned char>(c) <= ' ' || c == '"' || c == '\'' || c == '\\') {
        return absl::InvalidArgumentError(fmt::format(
            "{}: the new password has a space, quote, backslash or control character, which "
            "ipmitool cannot be given",
            Where()));
      }
    }
    absl::StatusOr<std::string> users = Call({"user", "list", "1"});
    if (!users.ok()) return users.status();
    std::optional<int> id = UserId(*users);
    if (!id) {
      return absl::NotFoundError(
          fmt::format("{}: no user named {} on channel 1", Where(), e_.user));
    }
    // The command with the password goes through a file only ipmitool reads.
    std::filesystem::path file = options_.work_dir / fmt::format("ipmi-{}.cmd", getpid());
    std::string text = fmt::format("user set password {} {}{}\n", *id, password,
                                   password.size() > 16 ? " 20" : "");
    {
      Fd fd(open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
      if (!fd) {
        return absl::InternalError(
            fmt::format("{}: cannot write {}: {}", Where(), file.string(), strerror(errno)));
      }
      if (write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
        unlink(file.c_str());
        return absl::InternalError(fmt::format("{}: cannot write {}", Where(), file.string()));
      }
    }
    absl::StatusOr<std::string> out = Call({"exec", file.string()});
    unlink(file.c_str());
    if (!out.ok()) return out.status();
    if (absl::StrContains(*out, "Set User Password command successful")) return absl::OkStatus();
    return absl::FailedPreconditionError(
        fmt::format("{}: the BMC did not take the new password: {}", Where(), Tail(*out)));
  }

  void Close() override {}

 private:
  std::string Where() const { return fmt::format("BMC {}:{} (IPMI)", e_.host, e_.port); }

  // The last line or two of ipmitool's words, for a message.
  static std::string Tail(const std::string& out) {
    std::string trimmed = out;
    while (!trimmed.empty() && std::isspace(static_cast<unsigned char>(trimmed.back())))
      trimmed.pop_back();
    std::size_t from = trimmed.size() > 200 ? trimmed.size() - 200 : 0;
    std::string tail = trimmed.substr(from);
    for (char& c : tail) {
      if (c == '\n') c = ' ';
    }
    return tail;
  }

  std::optional<int> UserId(const std::string& list) const {
    std::size_t start = 0;
    while (start < list.size()) {
      std::size_t end = list.find('\n', start);
      if (end == std::string::npos) end = list.size();
      std::string line = list.substr(start, end - start);
      start = end + 1;
      // "ID  Name  Callin ...": the id, then the name.
      char* rest = nullptr;
      long id = std::strtol(line.c_str(), &rest, 10);
      if (rest == line.c_str() || id <= 0) continue;
      std::string tail(rest);
      std::size_t name_at = tail.find_first_not_of(" \t");
      if (name_at == std::string::npos) continue;
      std::string name = tail.substr(name_at, tail.find_first_of(" \t", name_at) - name_at);
      if (name == e_.user) return static_cast<int>(id);
    }
    return std::nullopt;
  }

  // Runs ipmitool with `args`: its output when it logged in; the failure otherwise.
  absl::StatusOr<std::string> Call(const std::vector<std::string>& args) {
    cipher_refused_ = false;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(e_.deadline - Clock::now());
    if (left.count() <= 0) {
      return absl::DeadlineExceededError(fmt::format("{}: out of time", Where()));
    }
    std::vector<std::string> argv = {options_.ipmitool,
                                     "-I",
                                     "lanplus",
                                     "-H",
                                     e_.host,
                                     "-p",
                                     std::to_string(e_.port),
                                     "-U",
                                     e_.user,
                                     "-E",
                                     "-C",
                                     cipher_,
                                     "-N",
                                     "1",
                                     "-R",
                                     "2",
                                     "-v"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<std::string> env = {"IPMI_PASSWORD=" + e_.password};
    std::chrono::milliseconds limit = std::min(left, std::chrono::milliseconds(15000));
    absl::StatusOr<ToolRun> run = options_.run ? options_.run(argv, env, limit, e_.stop)
                                               : RunTool(argv, env, limit, e_.stop, 64 * 1024);
    if (!run.ok()) {
      if (absl::IsNotFound(run.status())) {
        return absl::FailedPreconditionError(
            fmt::format("{}: {} is not installed", Where(), options_.ipmitool));
      }
      return absl::Status(run.status().code(),
                          fmt::format("{}: {}", Where(), ToStd(run.status().message())));
    }
    const std::string& out = run->output;
    if (absl::StrContains(out, "RAKP 2 HMAC is invalid") ||
        absl::StrContains(out, "unauthorized name") ||
        absl::StrContains(out, "Invalid user name")) {
      return absl::UnauthenticatedError(
          fmt::format("{}: the BMC refused the credential of {}", Where(), e_.user));
    }
    if (absl::StrContains(out, "invalid authentication algorithm") ||
        absl::StrContains(out, "invalid integrity algorithm") ||
        absl::StrContains(out, "invalid confidentiality algorithm") ||
        absl::StrContains(out, "no matching cipher suite")) {
      cipher_refused_ = true;
      return absl::FailedPreconditionError(
          fmt::format("{}: the BMC refused cipher suite {}", Where(), cipher_));
    }
    if (absl::StrContains(out, "Unable to establish") ||
        absl::StrContains(out, "Insufficient privilege")) {
      return absl::UnavailableError(
          fmt::format("{}: no IPMI session: {}", Where(),
                      absl::StrContains(out, "Get Auth Capabilities error") ||
                              absl::StrContains(out, "No response")
                          ? "no answer"
                          : Tail(out)));
    }
    if (run->exit_code != 0 && !absl::StrContains(out, "failed")) {
      return absl::UnavailableError(fmt::format("{}: ipmitool exited with status {}: {}", Where(),
                                                run->exit_code, Tail(out)));
    }
    return out;
  }

  BmcEndpoint e_;
  IpmiOptions options_;
  std::string cipher_ = "17";
  bool cipher_refused_ = false;
  std::optional<std::string> first_status_;  // Open's answer, not read again
};

}  // namespace

std::string IpmiSuites::For(const std::string& bmc) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto found = suites_.find(bmc);
  return found == suites_.end() ? std::string() : found->second;
}

void IpmiSuites::Remember(const std::string& bmc, const std::string& suite) {
  std::lock_guard<std::mutex> lock(mu_);
  if (suites_.size() >= 4096 && !suites_.contains(bmc)) suites_.clear();  // bounded
  suites_[bmc] = suite;
}

absl::StatusOr<std::unique_ptr<BmcSession>> OpenIpmi(const BmcEndpoint& endpoint,
                                                     const IpmiOptions& options) {
  auto session = std::make_unique<IpmiSession>(endpoint, options);
  if (absl::Status s = session->Open(); !s.ok()) return s;
  return std::unique_ptr<BmcSession>(std::move(session));
}

}  // namespace bcd
