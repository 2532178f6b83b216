#pragma once

// The boot server's entries (boot.prepareRamdisk adds one, boot.cleanUp removes it): one per MAC,
// kept in <state_dir>/boot/entries.json (0600, written atomically at every change, so an entry
// and a token's use survive a restart) and gone once `expires_at` passes.
//
// Each entry holds the discovery token the booting machine presents for its assertion. The token
// travels in clear on the site LAN (the iPXE script puts it on the kernel command line), so it is
// worth one assertion, for its MAC and entry, before the entry expires: TakeToken marks it used on
// disk before it says yes.

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "base/mutex.h"

namespace bcd {

struct BootEntry {
  std::string mac;  // lowercase, colon-separated
  std::string id;
  std::string workflow_id, step_id, command_id;  // who prepared it
  std::string kernel_url, initrd_url, cmdline;
  std::string kernel_sha256, initrd_sha256;  // 32 raw bytes each, or empty: redirected, not cached
  int64_t prepared_at = 0, expires_at = 0;   // unix seconds
  std::string token;                         // the discovery token
  bool token_used = false;
};

// Why a token was not taken: each a refusal the boot server names.
enum class TokenRefusal { kUnknownMac, kWrongToken, kUsed, kExpired };
std::string_view TokenRefusalName(TokenRefusal refusal);

class BootEntries {
 public:
  // Reads <dir>/entries.json when there is one (a corrupt file is an error naming it, never
  // replaced); `dir` is made 0700 when missing.
  static absl::StatusOr<std::unique_ptr<BootEntries>> Open(const std::filesystem::path& dir,
                                                           UnixClock now);

  // Adds `entry`, replacing whatever entry its MAC had.
  absl::Status Put(const BootEntry& entry);
  // Removes the MAC's entry when `id` is its id (or empty); false when there was none to remove.
  absl::StatusOr<bool> Remove(const std::string& mac, const std::string& id);
  // The MAC's entry while it has not expired.
  std::optional<BootEntry> Find(const std::string& mac) const;
  // The MAC's entry when `token` is its unused token and it has not expired; the token is then
  // used, on disk, before this returns. A refusal otherwise (checked in that order).
  absl::StatusOr<BootEntry> TakeToken(const std::string& mac, const std::string& token,
                                      TokenRefusal* refusal);
  // The sha256s (raw) the live entries name: what the cache must keep.
  std::set<std::string> Referenced() const;
  std::size_t size() const;

  std::filesystem::path path() const { return dir_ / "entries.json"; }

 private:
  BootEntries(std::filesystem::path dir, UnixClock now)
      : dir_(std::move(dir)), now_(std::move(now)) {}
  absl::Status Save() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropExpired() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::filesystem::path dir_;
  UnixClock now_;
  mutable Mutex mu_;
  std::map<std::string, BootEntry> entries_ ABSL_GUARDED_BY(mu_);  // by MAC
};

// The sha256 (raw) of what `fd` holds, read with pread from the start; nullopt on a read error.
// The kinds check downloads with it, the server cached files.
std::optional<std::string> Sha256OfFile(int fd);

// "aa:bb:cc:dd:ee:ff" from that or "AA-BB-CC-DD-EE-FF" (iPXE's ${mac:hexhyp}); nullopt when it is
// not a MAC.
std::optional<std::string> NormalMac(std::string_view text);

}  // namespace bcd
