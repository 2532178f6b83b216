// A real machine boots from the site agent: QEMU (software emulation) with a virtio NIC whose iPXE
// ROM (Debian's ipxe-qemu) PXE-boots through QEMU's user network, fetches the boot server's chain
// script, the per-MAC script, and the kernel (Debian's cloud kernel) and initrd (busybox, built by
// testing/metal/make-initramfs.sh) the boot server cached from nginx against their pins. The booted
// ramdisk prints its command line, trades the discovery token on it for an assertion and prints
// that: the test checks both on the VM's serial console. About 10 s of emulated boot.

#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "bettercompute/agent/v1/ramdisk.pb.h"
#include "bettercompute/site/v1/site.pb.h"
#include "fmt/format.h"
#include "gtest/gtest.h"
#include "modes/site/site_mode.h"
#include "pki/base64url.h"
#include "pki/envelope.h"
#include "pki/keys.h"
#include "proto/signing_input.h"
#include "testing/child_process.h"
#include "testing/metal.h"
#include "testing/nginx.h"
#include "tests/integration/joined_node.h"
#include "tests/unit/fake_root.h"

namespace bcd {
namespace {

namespace v1 = bettercompute::agent::v1;
namespace site = bettercompute::site::v1;
using bcd::testing::FakeRoot;
using bcd::testing::JoinedNode;
using bcd::testing::Nginx;

constexpr char kMac[] = "52:54:00:12:34:56";
constexpr char kToken[] = "vm-token-0123456789abcdef";

TEST(MetalBoot, AQemuMachinePxeBootsTheEntrysKernelAndTradesItsTokenForAnAssertion) {
  FakeRoot files;
  absl::StatusOr<bcd::testing::BootImages> images =
      bcd::testing::MakeBootImages(files.path() / "www");
  ASSERT_TRUE(images.ok()) << images.status();
  absl::StatusOr<std::unique_ptr<Nginx>> nginx =
      Nginx::Start(files.path() / "nginx", {.root = files.path() / "www"});
  ASSERT_TRUE(nginx.ok()) << nginx.status();

  int port = bcd::testing::FreeLoopbackPort();
  JoinedNode node({.node_id = "site-1", .extra_config = [port](const std::filesystem::path&) {
                     // The guest reaches the host's loopback at 10.0.2.2 (QEMU's user network).
                     return fmt::format(
                         "[boot]\nlisten = \"127.0.0.1:{}\"\nurl = \"http://10.0.2.2:{}\"\n", port,
                         port);
                   }});
  node.gateway->AddSecret("boot/vm", kToken, {"wf-vm", "step-1", ""});
  node.Start(std::make_unique<SiteMode>());
  ASSERT_TRUE(node.gateway->WaitForWelcomes(1, std::chrono::seconds(60)));

  site::PrepareRamdiskPayload entry;
  entry.set_mac(kMac);
  entry.set_boot_entry_id("be-vm");
  entry.set_kernel_url((*nginx)->url() + "/vmlinuz");
  entry.set_initrd_url((*nginx)->url() + "/initrd.gz");
  entry.set_kernel_sha256(images->kernel_sha256);
  entry.set_initrd_sha256(images->initrd_sha256);
  entry.set_cmdline("console=ttyS0 panic=-1");
  entry.set_discovery_token_ref("boot/vm");
  entry.set_expires_at(static_cast<uint64_t>(bcd::testing::SystemNow() + 600));
  node.SendCommand("prepare-vm", "boot.prepareRamdisk", entry, "wf-vm", "step-1");
  v1::CommandUpdate prepared = node.WaitTerminal("prepare-vm");
  ASSERT_EQ(prepared.state(), v1::COMMAND_STATE_SUCCEEDED) << prepared.message();
  nginx->reset();  // from here on only the boot server's cache has the images

  absl::StatusOr<std::string> console =
      bcd::testing::PxeBootVm({.mac = kMac,
                               .bootfile = fmt::format("http://10.0.2.2:{}/boot.ipxe", port),
                               .console = files.path() / "console.log"});
  ASSERT_TRUE(console.ok()) << console.status();

  std::smatch cmdline;
  ASSERT_TRUE(std::regex_search(*console, cmdline, std::regex("bcd-test: cmdline: ([^\r\n]*)")))
      << *console;
  EXPECT_EQ(cmdline[1].str(),
            fmt::format("console=ttyS0 panic=-1 initrd=initrd bcd.boot=http://10.0.2.2:{} "
                        "bcd.gateway={} bcd.mac={} bcd.entry=be-vm bcd.token={}",
                        port, node.config->gateway_url()->text(), kMac, kToken));
  std::smatch answer;
  ASSERT_TRUE(
      std::regex_search(*console, answer, std::regex("bcd-test: assertion: ([A-Za-z0-9_-]+)")))
      << *console;
  std::optional<std::string> bytes = pki::Base64UrlDecode(answer[1].str());
  ASSERT_TRUE(bytes.has_value());
  v1::SignedDiscoveryAssertion signed_assertion;
  ASSERT_TRUE(signed_assertion.ParseFromString(*bytes));
  EXPECT_TRUE(pki::VerifyWithChain(
                  proto::BodySigningInput(proto::Purpose::kDiscovery, signed_assertion.body()),
                  signed_assertion.signature(), {node.pki.node_ca()}, bcd::testing::SystemNow())
                  .ok());
  v1::DiscoveryAssertion assertion;
  ASSERT_TRUE(assertion.ParseFromString(signed_assertion.body()));
  EXPECT_EQ(assertion.mac(), kMac);
  EXPECT_EQ(assertion.boot_entry_id(), "be-vm");
  EXPECT_EQ(assertion.workflow_id(), "wf-vm");
  EXPECT_EQ(assertion.nonce().size(), 16u);

  // The access log names each fetch: the chain script, the MAC's script, kernel and initrd, all
  // from the cache (200, whole).
  std::string log = node.LogText();
  for (std::string what : {"script", "kernel", "initrd", "discovery"}) {
    EXPECT_NE(log.find(fmt::format("what={} mac=52:54:00:12:34:56", what)), std::string::npos)
        << what << "\n"
        << log;
  }
  EXPECT_NE(log.find("what=kernel mac=52:54:00:12:34:56 entry=be-vm status=200"), std::string::npos)
      << log;
  node.Stop();
}

}  // namespace
}  // namespace bcd
