#pragma once

// Bare metal in a box, for the boot server's tests, benchmark and the dev stack: a kernel and a
// tiny ramdisk to boot (Debian's cloud kernel from /boot, busybox-static packed by
// testing/metal/make-initramfs.sh with an init that prints its command line, trades the discovery
// token on it for an assertion at the boot server and powers off), and a QEMU machine (software
// emulation: KVM does not work here) that PXE-boots them through its virtio NIC's iPXE ROM over
// QEMU's user network, where 10.0.2.2 is the host's loopback.

#include <chrono>
#include <filesystem>
#include <string>

#include "absl/status/statusor.h"

namespace bcd::testing {

struct BootImages {
  std::filesystem::path kernel, initrd;      // <dir>/vmlinuz, <dir>/initrd.gz
  std::string kernel_sha256, initrd_sha256;  // raw
};
// Copies the newest /boot/vmlinuz-* into `dir` and builds the ramdisk for it there.
absl::StatusOr<BootImages> MakeBootImages(const std::filesystem::path& dir);

struct VmOptions {
  std::string mac;                // the NIC's
  std::string bootfile;           // what DHCP names: http://10.0.2.2:PORT/boot.ipxe
  std::filesystem::path console;  // the serial console is written here
  std::chrono::seconds limit{180};
};
// Runs the machine until it powers off (or `limit` passes: an error with the console's end) and
// returns what its serial console printed.
absl::StatusOr<std::string> PxeBootVm(const VmOptions& options);

}  // namespace bcd::testing
