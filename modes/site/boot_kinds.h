#pragma once

// boot.prepareRamdisk and boot.cleanUp, and the boot server they feed ([boot]; boot_server.h).
//
// prepareRamdisk checks the entry (MAC, id, URLs, sha256s, a command line that is one line of
// printable text, an expiry in the future), fetches its discovery token (a secret bound to the
// command's workflow step), brings a kernel and initrd that pin a sha256 into the cache (the
// download is checked against the pin before it takes its name; one already there is checked
// again) and adds the entry, replacing the MAC's previous one. cleanUp removes the MAC's entry.
// Both drop cache files no live entry names.

#include <memory>

#include "absl/status/statusor.h"
#include "daemon/mode.h"

namespace bcd {

class BootService {
 public:
  virtual ~BootService() = default;
  // The boot server's port (0 when [boot] is not set and no server runs).
  virtual uint16_t port() const = 0;
};

// Registers both kinds and, when the config has [boot], starts the boot server (the entries in
// <state_dir>/boot). Without [boot] the kinds refuse every command, naming the missing section.
// The returned service stops the server when it goes.
absl::StatusOr<std::unique_ptr<BootService>> StartBoot(const ModeContext& context);

}  // namespace bcd
