// Arbitrary bytes as one HTTP request to the site agent's boot server (scripts, images with
// ranges, discovery POSTs) or, when the first byte is '{', as the boot entries file it reads at
// start.

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string_view>

#include "modes/site/boot_entries.h"
#include "modes/site/boot_server.h"
#include "pki/envelope.h"
#include "pki/keys.h"

namespace {

std::filesystem::path TempDir() {
  char path[] = "/tmp/bcd-boot-fuzz-XXXXXX";
  return mkdtemp(path);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::ostringstream sink;
  static bcd::Logger log(&sink, bcd::LogLevel::kError);
  static std::filesystem::path dir = TempDir();
  static bcd::pki::PrivateKey key = *bcd::pki::PrivateKey::Generate();
  static std::unique_ptr<bcd::BootEntries> entries = [] {
    auto made = *bcd::BootEntries::Open(dir / "boot", [] { return int64_t{1'000'000}; });
    std::string kernel(5000, 'k');
    std::filesystem::create_directories(dir / "cache");
    std::ofstream(dir / "cache" / bcd::pki::Hex(bcd::pki::Sha256(kernel))) << kernel;
    (void)made->Put({.mac = "52:54:00:12:34:56",
                     .id = "be-1",
                     .workflow_id = "wf-1",
                     .kernel_url = "https://images.example/vmlinuz",
                     .initrd_url = "https://images.example/initrd",
                     .cmdline = "console=ttyS0",
                     .kernel_sha256 = bcd::pki::Sha256(kernel),
                     .expires_at = 2'000'000,
                     .token = "tok-0123456789abcdef"});
    return made;
  }();
  static bcd::BootServer* server =
      bcd::BootServer::Start(
          {.listen = {"127.0.0.1", 0},
           .url = "http://10.0.2.2:8080",
           .gateway = "https://gw.example:443",
           .site = "site-1",
           .entries = entries.get(),
           .cache_dir = dir / "cache",
           .sign = [](std::string_view input) { return bcd::pki::Sign(input, key, "fuzz"); },
           .now = [] { return int64_t{1'000'000}; }},
          &log)
          ->release();
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  if (bytes.starts_with("{")) {
    std::filesystem::path other = dir / "entries-fuzz";
    std::filesystem::create_directories(other);
    std::ofstream(other / "entries.json", std::ios::trunc | std::ios::binary) << bytes;
    (void)bcd::BootEntries::Open(other, [] { return int64_t{1'000'000}; });
    return 0;
  }
  std::string answer = server->AnswerBytes(bytes, "127.0.0.1");
  // Whatever came in, the answer is a whole HTTP/1.1 response or nothing yet, and never the
  // token to anyone but the MAC's script.
  if (!answer.empty() && !answer.starts_with("HTTP/1.1 ")) __builtin_trap();
  return 0;
}
