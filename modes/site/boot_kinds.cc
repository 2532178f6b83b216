#include "modes/site/boot_kinds.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fd.h"
#include "base/files.h"
#include "bettercompute/site/v1/site.pb.h"
#include "config/values.h"
#include "daemon/dispatch/dispatcher.h"
#include "daemon/secrets/secrets.h"
#include "daemon/session/session.h"
#include "fmt/format.h"
#include "modes/site/boot_entries.h"
#include "modes/site/boot_server.h"
#include "pki/keys.h"
#include "proto/absl_compat.h"
#include "transport/http_client.h"

namespace bcd {
namespace {

namespace v1 = bettercompute::agent::v1;
namespace site = bettercompute::site::v1;

constexpr std::size_t kMaxCmdline = 2048;
constexpr uint64_t kMaxImageBytes = uint64_t{2} << 30;
constexpr int64_t kMaxEntrySeconds = 7 * 24 * 3600;

// What the handlers and the server share; kept by the handlers (the dispatcher) and the service.
struct BootShared {
  std::shared_ptr<BootEntries> entries;
  std::filesystem::path cache_dir;
  SecretClient* secrets = nullptr;
  UnixClock now;
  Logger* log = nullptr;
  bool configured = false;
};

absl::Status NotConfigured() {
  return absl::FailedPreconditionError(
      "this site agent has no boot server: its config has no [boot] section");
}

bool IdText(std::string_view text) {
  if (text.empty() || text.size() > 128) return false;
  for (char c : text) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
      return false;
  }
  return true;
}

// The token goes on a kernel command line: one word of URL-safe characters.
bool TokenText(std::string_view text) {
  if (text.size() < 16 || text.size() > 256) return false;
  for (char c : text) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
          c == '~'))
      return false;
  }
  return true;
}

// Brings `url` into the cache as <hex of sha256>, checked against it.
absl::Status Cache(const BootShared& c, std::string_view what, const std::string& url,
                   const std::string& sha256, const std::atomic<bool>& stop) {
  std::filesystem::path path = c.cache_dir / pki::Hex(sha256);
  if (Fd have(open(path.c_str(), O_RDONLY | O_CLOEXEC)); have) {
    if (Sha256OfFile(have.get()) == sha256) return absl::OkStatus();
    c.log->Warn("boot.cache_mismatch",
                {{"file", path.string()}, {"want", pki::Hex(sha256)}, {"got", "(another file)"}});
  }
  std::filesystem::path partial = path;
  partial += ".partial";
  absl::StatusOr<Downloaded> got = HttpGetToFile({.url = url,
                                                  .file = partial,
                                                  .max_bytes = kMaxImageBytes,
                                                  .timeout = std::chrono::minutes(10),
                                                  .stop = &stop,
                                                  .allow_http = true});
  if (!got.ok()) {
    return absl::Status(got.status().code(),
                        fmt::format("{}_url: {}", what, ToStd(got.status().message())));
  }
  if (got->sha256 != sha256) {
    unlink(partial.c_str());
    return absl::FailedPreconditionError(
        fmt::format("{}_url: what it serves has sha256 {}, the payload pins {}: not cached", what,
                    pki::Hex(got->sha256), pki::Hex(sha256)));
  }
  if (rename(partial.c_str(), path.c_str()) != 0) {
    absl::Status s = ErrnoStatus("boot cache: cannot rename into", path);
    unlink(partial.c_str());
    return s;
  }
  return absl::OkStatus();
}

// Removes cache files no live entry names (and partial downloads not running now: the lane runs
// one prepare at a time).
void Sweep(const BootShared& c) {
  std::set<std::string> keep;
  for (const std::string& sha : c.entries->Referenced()) keep.insert(pki::Hex(sha));
  std::error_code ec;
  for (const auto& file : std::filesystem::directory_iterator(c.cache_dir, ec)) {
    std::string name = file.path().filename().string();
    if (keep.contains(name)) continue;
    std::filesystem::remove(file.path(), ec);
  }
}

absl::Status CheckUrl(std::string_view what, const std::string& url) {
  absl::StatusOr<Url> parsed = Url::Parse(url, {"https", "http"}, /*allow_query=*/true);
  if (!parsed.ok())
    return absl::InvalidArgumentError(
        fmt::format("{}: {}", what, ToStd(parsed.status().message())));
  for (char c : url) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f)
      return absl::InvalidArgumentError(
          fmt::format("{}: spaces and control characters are not "
                      "allowed in a URL",
                      what));
  }
  return absl::OkStatus();
}

class PrepareHandler final
    : public TypedHandler<site::PrepareRamdiskPayload, site::PrepareRamdiskResult> {
 public:
  explicit PrepareHandler(std::shared_ptr<const BootShared> c) : c_(std::move(c)) {}

  absl::Status Check(const v1::Command&, const site::PrepareRamdiskPayload& p) const override {
    if (!c_->configured) return NotConfigured();
    if (NormalMac(p.mac()) != p.mac()) {
      return absl::InvalidArgumentError(fmt::format(
          "mac: expected a lowercase colon-separated MAC, got \"{}\"", p.mac().substr(0, 64)));
    }
    if (!IdText(p.boot_entry_id())) {
      return absl::InvalidArgumentError(
          "boot_entry_id: expected 1 to 128 letters, digits, '-', '_' or '.'");
    }
    if (absl::Status s = CheckUrl("kernel_url", p.kernel_url()); !s.ok()) return s;
    if (absl::Status s = CheckUrl("initrd_url", p.initrd_url()); !s.ok()) return s;
    for (auto [name, sha] : {std::pair{"kernel_sha256", &p.kernel_sha256()},
                             std::pair{"initrd_sha256", &p.initrd_sha256()}}) {
      if (!sha->empty() && sha->size() != 32) {
        return absl::InvalidArgumentError(
            fmt::format("{}: expected 32 bytes or none, got {}", name, sha->size()));
      }
    }
    if (p.cmdline().size() > kMaxCmdline) {
      return absl::InvalidArgumentError(
          fmt::format("cmdline: {} bytes, more than {}", p.cmdline().size(), kMaxCmdline));
    }
    for (char c : p.cmdline()) {
      auto u = static_cast<unsigned char>(c);
      if (u < 0x20 || u == 0x7f) {
        return absl::InvalidArgumentError(
            "cmdline: a control character (a line break would add commands to the iPXE script)");
      }
    }
    if (p.discovery_token_ref().empty())
      return absl::InvalidArgumentError("discovery_token_ref: empty");
    int64_t now = c_->now();
    if (p.expires_at() <= static_cast<uint64_t>(now)) {
      return absl::InvalidArgumentError(
          fmt::format("expires_at: {} is not in the future (now {})", p.expires_at(), now));
    }
    if (p.expires_at() > static_cast<uint64_t>(now + kMaxEntrySeconds)) {
      return absl::InvalidArgumentError(
          fmt::format("expires_at: more than {} days ahead", kMaxEntrySeconds / 86400));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<site::PrepareRamdiskResult> Execute(const v1::Command& command,
                                                     const site::PrepareRamdiskPayload& p,
                                                     const std::atomic<bool>& stop) override {
    absl::StatusOr<std::vector<std::string>> token =
        c_->secrets->ResolveFor(command, {p.discovery_token_ref()});
    if (!token.ok()) return token.status();
    if (!TokenText(token->front())) {
      return absl::InvalidArgumentError(fmt::format(
          "the discovery token of {} must be 16 to 256 letters, digits, '-', '_', '.' or '~'",
          p.discovery_token_ref()));
    }
    if (!p.kernel_sha256().empty()) {
      if (absl::Status s = Cache(*c_, "kernel", p.kernel_url(), p.kernel_sha256(), stop); !s.ok())
        return Failed(command, p, s);
    }
    if (!p.initrd_sha256().empty()) {
      if (absl::Status s = Cache(*c_, "initrd", p.initrd_url(), p.initrd_sha256(), stop); !s.ok())
        return Failed(command, p, s);
    }
    BootEntry entry{.mac = p.mac(),
                    .id = p.boot_entry_id(),
                    .workflow_id = command.workflow_id(),
                    .step_id = command.step_id(),
                    .command_id = command.command_id(),
                    .kernel_url = p.kernel_url(),
                    .initrd_url = p.initrd_url(),
                    .cmdline = p.cmdline(),
                    .kernel_sha256 = p.kernel_sha256(),
                    .initrd_sha256 = p.initrd_sha256(),
                    .prepared_at = c_->now(),
                    .expires_at = static_cast<int64_t>(p.expires_at()),
                    .token = token->front()};
    if (absl::Status s = c_->entries->Put(entry); !s.ok()) return Failed(command, p, s);
    Sweep(*c_);
    c_->log->Info(
        "boot.prepared",
        {{"command_id", command.command_id()},
         {"mac", p.mac()},
         {"entry", p.boot_entry_id()},
         {"cached", p.kernel_sha256().empty() && p.initrd_sha256().empty() ? "false" : "true"},
         {"expires_at", std::to_string(p.expires_at())}});
    site::PrepareRamdiskResult result;
    result.set_boot_entry_id(p.boot_entry_id());
    return result;
  }

 private:
  absl::Status Failed(const v1::Command& command, const site::PrepareRamdiskPayload& p,
                      absl::Status status) const {
    c_->log->Warn("boot.prepare_failed", {{"command_id", command.command_id()},
                                          {"mac", p.mac()},
                                          {"entry", p.boot_entry_id()},
                                          {"error", std::string(ToStd(status.message()))}});
    return status;
  }
  std::shared_ptr<const BootShared> c_;
};

class CleanUpHandler final
    : public TypedHandler<site::BootCleanUpPayload, site::BootCleanUpResult> {
 public:
  explicit CleanUpHandler(std::shared_ptr<const BootShared> c) : c_(std::move(c)) {}

  absl::Status Check(const v1::Command&, const site::BootCleanUpPayload& p) const override {
    if (!c_->configured) return NotConfigured();
    if (NormalMac(p.mac()) != p.mac()) {
      return absl::InvalidArgumentError(fmt::format(
          "mac: expected a lowercase colon-separated MAC, got \"{}\"", p.mac().substr(0, 64)));
    }
    if (!p.boot_entry_id().empty() && !IdText(p.boot_entry_id())) {
      return absl::InvalidArgumentError(
          "boot_entry_id: expected 1 to 128 letters, digits, '-', '_' or '.'");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<site::BootCleanUpResult> Execute(const v1::Command& command,
                                                  const site::BootCleanUpPayload& p,
                                                  const std::atomic<bool>&) override {
    absl::StatusOr<bool> removed = c_->entries->Remove(p.mac(), p.boot_entry_id());
    if (!removed.ok()) return removed.status();
    Sweep(*c_);
    c_->log->Info("boot.cleaned", {{"command_id", command.command_id()},
                                   {"mac", p.mac()},
                                   {"entry", p.boot_entry_id()},
                                   {"removed", *removed ? "true" : "false"}});
    site::BootCleanUpResult result;
    result.set_removed(*removed);
    return result;
  }

 private:
  std::shared_ptr<const BootShared> c_;
};

class Service final : public BootService {
 public:
  Service(std::shared_ptr<BootShared> shared, std::unique_ptr<BootServer> server)
      : shared_(std::move(shared)), server_(std::move(server)) {}
  uint16_t port() const override { return server_ ? server_->port() : 0; }

 private:
  std::shared_ptr<BootShared> shared_;
  std::unique_ptr<BootServer> server_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BootService>> StartBoot(const ModeContext& context) {
  auto shared = std::make_shared<BootShared>();
  shared->secrets = context.secrets;
  shared->now = context.now;
  shared->log = context.log;
  const std::optional<Config::Boot>& boot = context.config->boot();
  std::unique_ptr<BootServer> server;
  if (boot) {
    if (context.secrets == nullptr)
      return absl::FailedPreconditionError("the boot kinds need the secret client");
    std::filesystem::path dir = context.state_dir / "boot";
    absl::StatusOr<std::unique_ptr<BootEntries>> entries = BootEntries::Open(dir, context.now);
    if (!entries.ok()) return entries.status();
    shared->entries = std::move(*entries);
    shared->cache_dir = dir / "cache";
    std::error_code ec;
    std::filesystem::create_directories(shared->cache_dir, ec);
    if (ec || chmod(shared->cache_dir.c_str(), 0700) != 0) {
      return absl::InternalError(fmt::format("{}: cannot make the boot cache: {}",
                                             shared->cache_dir.string(),
                                             ec ? ec.message() : std::strerror(errno)));
    }
    shared->configured = true;
    Sweep(*shared);
    SessionEngine* engine = context.engine;
    const std::optional<Url>& gateway = context.config->gateway_url();
    absl::StatusOr<std::unique_ptr<BootServer>> started = BootServer::Start(
        {.listen = boot->listen,
         .url = boot->url,
         .gateway = gateway ? gateway->text() : "",
         .site = context.site,
         .entries = shared->entries.get(),
         .cache_dir = shared->cache_dir,
         .sign = context.sign,
         .refused =
             [engine](const std::string& mac, const std::string& entry, std::string_view reason,
                      const std::string& peer) {
               if (engine == nullptr) return;
               (void)engine->Emit(
                   v1::SEVERITY_WARNING, "boot.discovery_refused",
                   fmt::format("a discovery token for {} was refused: {}", mac, reason),
                   {{"mac", mac},
                    {"boot_entry_id", entry},
                    {"reason", std::string(reason)},
                    {"peer", peer}});
             },
         .now = context.now,
         .metrics = context.metrics},
        context.log);
    if (!started.ok()) return started.status();
    server = std::move(*started);
  }
  std::shared_ptr<const BootShared> c = shared;
  if (absl::Status s =
          context.dispatcher->Register("boot.prepareRamdisk", std::make_unique<PrepareHandler>(c));
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          context.dispatcher->Register("boot.cleanUp", std::make_unique<CleanUpHandler>(c));
      !s.ok()) {
    return s;
  }
  return std::make_unique<Service>(std::move(shared), std::move(server));
}

}  // namespace bcd
