#include "testing/metal.h"

#include <fstream>
#include <sstream>

#include "base/files.h"
#include "fmt/format.h"
#include "pki/keys.h"
#include "testing/child_process.h"

namespace bcd::testing {
namespace {

std::string ReadAll(const std::filesystem::path& path) {
  return ReadWholeFile(path, std::size_t{1} << 30).value_or("");
}

}  // namespace

absl::StatusOr<BootImages> MakeBootImages(const std::filesystem::path& dir) {
  std::filesystem::path newest;
  std::error_code ec;
  for (const auto& file : std::filesystem::directory_iterator("/boot", ec)) {
    std::string name = file.path().filename().string();
    if (name.starts_with("vmlinuz-") && (newest.empty() || file.path() > newest))
      newest = file.path();
  }
  if (newest.empty()) {
    return absl::FailedPreconditionError(
        "no kernel in /boot: the boot tests need one (Debian: linux-image-cloud-amd64)");
  }
  std::string version = newest.filename().string().substr(8);
  std::filesystem::create_directories(dir);
  BootImages images{.kernel = dir / "vmlinuz", .initrd = dir / "initrd.gz"};
  std::filesystem::copy_file(newest, images.kernel,
                             std::filesystem::copy_options::overwrite_existing, ec);
  if (ec) return absl::InternalError(fmt::format("copy {}: {}", newest.string(), ec.message()));
  Ran made =
      RunShell(fmt::format("{} {} {} 2>&1", BCD_MAKE_INITRAMFS, images.initrd.string(), version));
  if (made.status != 0) return absl::InternalError("make-initramfs.sh: " + made.out);
  images.kernel_sha256 = pki::Sha256(ReadAll(images.kernel));
  images.initrd_sha256 = pki::Sha256(ReadAll(images.initrd));
  return images;
}

absl::StatusOr<std::string> PxeBootVm(const VmOptions& options) {
  Ran ran = RunShell(
      fmt::format("timeout -s KILL {} qemu-system-x86_64 -accel tcg -m 512 -nographic -no-reboot "
                  "-netdev user,id=n0,bootfile={} -device virtio-net-pci,netdev=n0,mac={} -boot n "
                  "> {} 2>&1",
                  options.limit.count(), options.bootfile, options.mac, options.console.string()));
  std::string console = ReadAll(options.console);
  if (ran.status != 0) {
    return absl::DeadlineExceededError(fmt::format(
        "qemu exited with {} (137: still running after {} s); its console ends:\n{}", ran.status,
        options.limit.count(), console.substr(console.size() > 3000 ? console.size() - 3000 : 0)));
  }
  return console;
}

}  // namespace bcd::testing
