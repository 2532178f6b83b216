#include "modes/site/boot_entries.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/files.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "pki/keys.h"
#include "proto/absl_compat.h"

namespace bcd {
namespace {

constexpr std::size_t kMaxFileBytes = 16 << 20;

std::optional<std::string> Unhex(std::string_view text) {
  if (text.size() % 2 != 0) return std::nullopt;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  std::string out;
  for (std::size_t i = 0; i < text.size(); i += 2) {
    int high = nibble(text[i]), low = nibble(text[i + 1]);
    if (high < 0 || low < 0) return std::nullopt;
    out.push_back(static_cast<char>(high << 4 | low));
  }
  return out;
}

nlohmann::json ToJson(const BootEntry& e) {
  return {{"mac", e.mac},
          {"id", e.id},
          {"workflow_id", e.workflow_id},
          {"step_id", e.step_id},
          {"command_id", e.command_id},
          {"kernel_url", e.kernel_url},
          {"initrd_url", e.initrd_url},
          {"cmdline", e.cmdline},
          {"kernel_sha256", pki::Hex(e.kernel_sha256)},
          {"initrd_sha256", pki::Hex(e.initrd_sha256)},
          {"prepared_at", e.prepared_at},
          {"expires_at", e.expires_at},
          {"token", e.token},
          {"token_used", e.token_used}};
}

absl::StatusOr<BootEntry> FromJson(const nlohmann::json& j) {
  BootEntry e;
  try {
    e.mac = j.at("mac").get<std::string>();
    e.id = j.at("id").get<std::string>();
    e.workflow_id = j.at("workflow_id").get<std::string>();
    e.step_id = j.at("step_id").get<std::string>();
    e.command_id = j.at("command_id").get<std::string>();
    e.kernel_url = j.at("kernel_url").get<std::string>();
    e.initrd_url = j.at("initrd_url").get<std::string>();
    e.cmdline = j.at("cmdline").get<std::string>();
    std::optional<std::string> kernel = Unhex(j.at("kernel_sha256").get<std::string>());
    std::optional<std::string> initrd = Unhex(j.at("initrd_sha256").get<std::string>());
    if (!kernel || !initrd) return absl::DataLossError("a sha256 is not hex");
    e.kernel_sha256 = *kernel;
    e.initrd_sha256 = *initrd;
    e.prepared_at = j.at("prepared_at").get<int64_t>();
    e.expires_at = j.at("expires_at").get<int64_t>();
    e.token = j.at("token").get<std::string>();
    e.token_used = j.at("token_used").get<bool>();
  } catch (const nlohmann::json::exception& error) {
    return absl::DataLossError(error.what());
  }
  if (NormalMac(e.mac) != e.mac) return absl::DataLossError(fmt::format("bad MAC {}", e.mac));
  return e;
}

}  // namespace

std::string_view TokenRefusalName(TokenRefusal refusal) {
  switch (refusal) {
    case TokenRefusal::kUnknownMac:
      return "no boot entry for this MAC";
    case TokenRefusal::kWrongToken:
      return "not the token of this MAC's boot entry";
    case TokenRefusal::kUsed:
      return "the token was used already";
    case TokenRefusal::kExpired:
      return "the boot entry expired";
  }
  return "refused";
}

std::optional<std::string> Sha256OfFile(int fd) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> sha(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(sha.get(), EVP_sha256(), nullptr);
  std::vector<char> chunk(1 << 20);
  for (off_t offset = 0;;) {
    ssize_t n = pread(fd, chunk.data(), chunk.size(), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::nullopt;
    if (n == 0) break;
    EVP_DigestUpdate(sha.get(), chunk.data(), static_cast<std::size_t>(n));
    offset += n;
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_DigestFinal_ex(sha.get(), digest, &size);
  return std::string(reinterpret_cast<char*>(digest), size);
}

std::optional<std::string> NormalMac(std::string_view text) {
  if (text.size() != 17) return std::nullopt;
  char separator = text[2];
  if (separator != ':' && separator != '-') return std::nullopt;
  std::string mac;
  for (std::size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (i % 3 == 2) {
      if (c != separator) return std::nullopt;
      mac.push_back(':');
      continue;
    }
    if (c >= 'A' && c <= 'F') c = static_cast<char>(c - 'A' + 'a');
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return std::nullopt;
    mac.push_back(c);
  }
  return mac;
}

absl::StatusOr<std::unique_ptr<BootEntries>> BootEntries::Open(const std::filesystem::path& dir,
                                                               UnixClock now) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || chmod(dir.c_str(), 0700) != 0) {
    return absl::InternalError(fmt::format("{}: cannot make the boot directory: {}", dir.string(),
                                           ec ? ec.message() : std::strerror(errno)));
  }
  std::unique_ptr<BootEntries> entries(new BootEntries(dir, std::move(now)));
  std::filesystem::path path = entries->path();
  if (!std::filesystem::exists(path, ec)) return entries;
  absl::StatusOr<std::string> text = ReadWholeFile(path, kMaxFileBytes);
  if (!text.ok()) return text.status();
  auto corrupt = [&](std::string_view why) {
    return absl::DataLossError(
        fmt::format("{}: the boot entries cannot be read ({}); move it aside to start with none",
                    path.string(), why));
  };
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("entries") || !j["entries"].is_array())
    return corrupt("not a JSON object with an entries array");
  MutexLock lock(entries->mu_);
  for (const nlohmann::json& item : j["entries"]) {
    absl::StatusOr<BootEntry> entry = FromJson(item);
    if (!entry.ok()) return corrupt(ToStd(entry.status().message()));
    std::string mac = entry->mac;
    entries->entries_[mac] = *std::move(entry);
  }
  return entries;
}

absl::Status BootEntries::Save() const {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& [mac, entry] : entries_) list.push_back(ToJson(entry));
  nlohmann::json j = {{"entries", std::move(list)}};
  return AtomicWriteFile(path(), j.dump(1), 0600);
}

void BootEntries::DropExpired() {
  int64_t now = now_();
  std::erase_if(entries_, [&](const auto& item) { return item.second.expires_at <= now; });
}

absl::Status BootEntries::Put(const BootEntry& entry) {
  MutexLock lock(mu_);
  DropExpired();
  std::optional<BootEntry> before;
  if (auto it = entries_.find(entry.mac); it != entries_.end()) before = it->second;
  entries_[entry.mac] = entry;
  absl::Status saved = Save();
  if (!saved.ok()) {  // as it was: memory never says what the disk does not
    if (before) {
      entries_[entry.mac] = *before;
    } else {
      entries_.erase(entry.mac);
    }
  }
  return saved;
}

absl::StatusOr<bool> BootEntries::Remove(const std::string& mac, const std::string& id) {
  MutexLock lock(mu_);
  DropExpired();
  auto it = entries_.find(mac);
  if (it == entries_.end() || (!id.empty() && it->second.id != id)) return false;
  BootEntry removed = it->second;
  entries_.erase(it);
  if (absl::Status s = Save(); !s.ok()) {
    entries_[mac] = removed;
    return s;
  }
  return true;
}

std::optional<BootEntry> BootEntries::Find(const std::string& mac) const {
  MutexLock lock(mu_);
  auto it = entries_.find(mac);
  if (it == entries_.end() || it->second.expires_at <= now_()) return std::nullopt;
  return it->second;
}

absl::StatusOr<BootEntry> BootEntries::TakeToken(const std::string& mac, const std::string& token,
                                                 TokenRefusal* refusal) {
  MutexLock lock(mu_);
  auto refuse = [&](TokenRefusal why) {
    *refusal = why;
    return absl::PermissionDeniedError(std::string(TokenRefusalName(why)));
  };
  auto it = entries_.find(mac);
  if (it == entries_.end()) return refuse(TokenRefusal::kUnknownMac);
  BootEntry& entry = it->second;
  if (entry.expires_at <= now_()) return refuse(TokenRefusal::kExpired);
  if (token.size() != entry.token.size() ||
      CRYPTO_memcmp(token.data(), entry.token.data(), token.size()) != 0) {
    return refuse(TokenRefusal::kWrongToken);
  }
  if (entry.token_used) return refuse(TokenRefusal::kUsed);
  entry.token_used = true;
  if (absl::Status s = Save(); !s.ok()) {
    entry.token_used = false;
    return s;
  }
  return entry;
}

std::set<std::string> BootEntries::Referenced() const {
  MutexLock lock(mu_);
  std::set<std::string> hashes;
  int64_t now = now_();
  for (const auto& [mac, entry] : entries_) {
    if (entry.expires_at <= now) continue;
    if (!entry.kernel_sha256.empty()) hashes.insert(entry.kernel_sha256);
    if (!entry.initrd_sha256.empty()) hashes.insert(entry.initrd_sha256);
  }
  return hashes;
}

std::size_t BootEntries::size() const {
  MutexLock lock(mu_);
  return entries_.size();
}

}  // namespace bcd
