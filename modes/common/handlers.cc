#include "modes/common/handlers.h"

#include "base/subprocess.h"
#include "config/config.h"
#include "fmt/format.h"
#include "modes/common/archive.h"
#include "proto/absl_compat.h"
#include "transport/http_client.h"

namespace bcd {

namespace v1 = bettercompute::agent::v1;

absl::StatusOr<v1::InventoryRefreshResult> InventoryRefreshHandler::Execute(
    const v1::Command&, const v1::InventoryRefreshPayload&, const std::atomic<bool>&) {
  InventorySources sources = sources_;
  sources.now = static_cast<uint64_t>(now_());
  bettercompute::common::v1::HardwareClaims claims = CollectInventory(sources);
  send_(claims);
  v1::InventoryRefreshResult result;
  result.set_collected_at(claims.collected_at());
  return result;
}

absl::Status LogsCollectHandler::Check(const v1::Command&,
                                       const v1::LogsCollectPayload& payload) const {
  if (payload.upload_url().empty()) return absl::InvalidArgumentError("upload_url is empty");
  for (const std::string& unit : payload.journal_units()) {
    if (!IsUnitName(unit) || unit.size() > 80) {
      return absl::InvalidArgumentError(
          fmt::format("journal unit \"{}\" is not a systemd unit name", unit));
    }
  }
  UploadRequest upload{.url = payload.upload_url()};
  for (const auto& [name, value] : payload.upload_headers()) upload.headers[name] = value;
  return CheckUploadRequest(upload);
}

absl::StatusOr<v1::LogsCollectResult> LogsCollectHandler::Execute(
    const v1::Command&, const v1::LogsCollectPayload& payload, const std::atomic<bool>& stop) {
  constexpr uint64_t kDefaultBudget = 64u << 20, kMaxBudget = 1u << 30;
  uint64_t budget = payload.max_bytes() == 0 ? kDefaultBudget
                                             : std::min<uint64_t>(payload.max_bytes(), kMaxBudget);
  std::vector<std::string> since;
  if (payload.since() != 0) since = {"--since", fmt::format("@{}", payload.since())};
  // (name in the bundle, argv)
  std::vector<std::pair<std::string, std::vector<std::string>>> sources;
  auto journal = [&](const std::string& unit) {
    std::vector<std::string> argv = {sources_.journalctl, "--no-pager", "-o",
                                     "short-iso-precise", "-u",         unit};
    argv.insert(argv.end(), since.begin(), since.end());
    return argv;
  };
  sources.emplace_back("bcd.log", journal(sources_.bcd_unit));
  for (const std::string& unit : payload.journal_units())
    sources.emplace_back("journal/" + unit + ".log", journal(unit));
  if (payload.include_dmesg())
    sources.emplace_back("dmesg.txt",
                         std::vector<std::string>{sources_.dmesg, "--time-format", "iso"});

  absl::StatusOr<std::unique_ptr<TarGzWriter>> archive =
      TarGzWriter::Create(sources_.work_dir, ".logs-");
  if (!archive.ok()) return archive.status();
  struct Cleanup {
    std::filesystem::path path;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove(path, ec);
    }
  } cleanup{(*archive)->path()};
  v1::LogsCollectResult result;
  std::string errors;
  int64_t now = sources_.now();
  for (const auto& [name, argv] : sources) {
    if (stop) return absl::CancelledError("stopped while collecting");
    if (budget == 0) {
      result.set_truncated(true);
      errors += fmt::format("{}: left out, the max_bytes budget was spent\n", name);
      continue;
    }
    bool truncated = false;
    absl::StatusOr<std::string> text =
        RunCapped(argv, std::chrono::minutes(2), budget, &truncated, &stop);
    if (stop) return absl::CancelledError("stopped while collecting");
    if (!text.ok()) {
      errors += fmt::format("{}: {}\n", name, ToStd(text.status().message()));
      continue;
    }
    if (truncated) result.set_truncated(true);
    budget -= text->size();
    if (absl::Status s = (*archive)->Add(name, *text, now); !s.ok()) return s;
    result.add_included(name);
  }
  if (!errors.empty()) {
    if (absl::Status s = (*archive)->Add("errors.txt", errors, now); !s.ok()) return s;
    result.add_included("errors.txt");
  }
  absl::StatusOr<TarGzWriter::Summary> summary = (*archive)->Finish();
  if (!summary.ok()) return summary.status();
  if (stop) return absl::CancelledError("stopped before the upload");
  UploadRequest upload{.url = payload.upload_url(), .file = cleanup.path, .stop = &stop};
  for (const auto& [name, value] : payload.upload_headers()) upload.headers[name] = value;
  if (absl::Status s = upload_(upload); !s.ok()) return s;
  result.set_size_bytes(summary->size_bytes);
  result.set_sha256(summary->sha256);
  return result;
}

}  // namespace bcd
