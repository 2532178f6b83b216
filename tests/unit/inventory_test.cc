#include "modes/common/inventory.h"

#include <sys/sysinfo.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "proto/absl_compat.h"
#include "tests/unit/fake_root.h"

namespace bcd {
namespace {

using bcd::testing::FakeRoot;
using ::testing::ElementsAre;

// Answers nvidia-smi with canned output and records what it was asked to run.
class FakeRunner : public CommandRunner {
 public:
  explicit FakeRunner(absl::StatusOr<std::string> answer) : answer_(std::move(answer)) {}
  absl::StatusOr<std::string> Run(const std::vector<std::string>& argv, std::chrono::milliseconds,
                                  std::size_t) override {
    calls.push_back(argv);
    return answer_;
  }
  std::vector<std::vector<std::string>> calls;

 private:
  absl::StatusOr<std::string> answer_;
};

const char kSmiOutput[] =
    "0, GPU-8c2b9a3e-1111-2222-3333-444455556666, NVIDIA H200, 1654923000123, 143771, "
    "550.54.15, 00000000:18:00.0\n";

TEST(Inventory, CollectsEveryClaimFromAFakeServer) {
  FakeRoot root;
  root.PopulateServer();
  FakeRunner runner(std::string{kSmiOutput});
  auto claims = CollectInventory({root.path(), "x86_64", &runner, 1700000000});

  EXPECT_EQ(claims.hostname(), "gpu-node-7");
  EXPECT_EQ(claims.machine_id(), "0123456789abcdef0123456789abcdef");
  EXPECT_EQ(claims.collected_at(), 1700000000u);
  EXPECT_EQ(claims.dmi().vendor(), "Supermicro");
  EXPECT_EQ(claims.dmi().product(), "SYS-821GE-TNHR");
  EXPECT_EQ(claims.dmi().serial(), "S123456X");
  EXPECT_EQ(claims.dmi().board_product(), "X13DEG-OAD");
  EXPECT_EQ(claims.dmi().bios_version(), "2.1");
  EXPECT_EQ(claims.dmi().uuid(), "");  // not readable here: left empty

  EXPECT_EQ(claims.cpu().model(), "Intel(R) Xeon(R) Platinum 8480+");
  EXPECT_EQ(claims.cpu().vendor(), "GenuineIntel");
  EXPECT_EQ(claims.cpu().sockets(), 2u);
  EXPECT_EQ(claims.cpu().cores(), 4u);
  EXPECT_EQ(claims.cpu().threads(), 8u);
  EXPECT_EQ(claims.cpu().architecture(), "x86_64");
  EXPECT_EQ(claims.memory_bytes(), 2113929216ull * 1024);

  ASSERT_EQ(claims.block_devices_size(), 2);
  const auto& nvme = claims.block_devices(0);
  EXPECT_EQ(nvme.name(), "nvme0n1");
  EXPECT_EQ(nvme.size_bytes(), 7501476528ull * 512);
  EXPECT_EQ(nvme.model(), "SAMSUNG MZQL27T6HBLA-00A07");
  EXPECT_EQ(nvme.serial(), "S6CKNE0T123456");
  EXPECT_EQ(nvme.wwn(), "eui.36344830526001230025384500000001");
  EXPECT_FALSE(nvme.rotational());
  const auto& sda = claims.block_devices(1);
  EXPECT_EQ(sda.name(), "sda");
  EXPECT_EQ(sda.serial(), "ZC1234AB");
  EXPECT_TRUE(sda.rotational());

  ASSERT_EQ(claims.network_interfaces_size(), 2);
  const auto& br0 = claims.network_interfaces(0);
  EXPECT_EQ(br0.name(), "br0");
  EXPECT_FALSE(br0.physical());
  EXPECT_EQ(br0.speed_mbps(), 0u);
  EXPECT_EQ(br0.pci_address(), "");
  const auto& eth0 = claims.network_interfaces(1);
  EXPECT_EQ(eth0.name(), "eth0");
  EXPECT_EQ(eth0.mac(), "b8:3f:d2:00:11:22");
  EXPECT_EQ(eth0.mtu(), 9000u);
  EXPECT_EQ(eth0.speed_mbps(), 100000u);
  EXPECT_EQ(eth0.operstate(), "up");
  EXPECT_TRUE(eth0.physical());
  EXPECT_EQ(eth0.pci_address(), "0000:17:00.0");
  EXPECT_EQ(eth0.driver(), "mlx5_core");

  ASSERT_EQ(claims.gpus_size(), 1);
  const auto& gpu = claims.gpus(0);
  EXPECT_EQ(gpu.pci_address(), "0000:18:00.0");
  EXPECT_EQ(gpu.vendor_id(), 0x10deu);
  EXPECT_EQ(gpu.device_id(), 0x2335u);
  EXPECT_EQ(gpu.numa_node(), 0);
  EXPECT_EQ(gpu.name(), "NVIDIA H200");
  EXPECT_EQ(gpu.uuid(), "GPU-8c2b9a3e-1111-2222-3333-444455556666");
  EXPECT_EQ(gpu.serial(), "1654923000123");
  EXPECT_EQ(gpu.memory_bytes(), 143771ull << 20);
  EXPECT_EQ(gpu.driver_version(), "550.54.15");

  EXPECT_EQ(claims.os().id(), "debian");
  EXPECT_EQ(claims.os().version_id(), "12");
  EXPECT_EQ(claims.os().pretty_name(), "Debian GNU/Linux 12 (bookworm)");
  EXPECT_EQ(claims.os().kernel_release(), "6.1.0-18-amd64");
  EXPECT_EQ(claims.os().kernel_version(), "#1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1");

  ASSERT_EQ(runner.calls.size(), 1u);
  EXPECT_THAT(
      runner.calls[0],
      ElementsAre("nvidia-smi",
                  "--query-gpu=index,uuid,name,serial,memory.total,driver_version,pci.bus_id",
                  "--format=csv,noheader,nounits"));
}

TEST(Inventory, KeepsPciFactsWhenNvidiaSmiIsMissing) {
  FakeRoot root;
  root.PopulateServer();
  FakeRunner runner(absl::NotFoundError("nvidia-smi: not found"));
  auto claims = CollectInventory({root.path(), "x86_64", &runner, 0});
  ASSERT_EQ(claims.gpus_size(), 1);
  EXPECT_EQ(claims.gpus(0).device_id(), 0x2335u);
  EXPECT_EQ(claims.gpus(0).name(), "");
}

TEST(Inventory, NeverRunsNvidiaSmiWithoutAnNvidiaGpu) {
  FakeRoot root;
  root.Write("proc/sys/kernel/hostname", "plain\n");
  FakeRunner runner(std::string{kSmiOutput});
  auto claims = CollectInventory({root.path(), "aarch64", &runner, 0});
  EXPECT_TRUE(runner.calls.empty());
  EXPECT_EQ(claims.gpus_size(), 0);
}

TEST(Inventory, AnEmptyTreeGivesEmptyClaimsNotAnError) {
  FakeRoot root;
  auto claims = CollectInventory({root.path(), "x86_64", nullptr, 0});
  EXPECT_EQ(claims.hostname(), "");
  EXPECT_EQ(claims.cpu().threads(), 0u);
  EXPECT_EQ(claims.cpu().sockets(), 0u);
  EXPECT_EQ(claims.block_devices_size(), 0);
}

TEST(Inventory, RefusesAMalformedMachineId) {
  FakeRoot root;
  root.Write("etc/machine-id", "not-a-machine-id\n");
  EXPECT_EQ(CollectInventory({root.path(), "", nullptr, 0}).machine_id(), "");
}

TEST(Inventory, ReadsOsReleaseFromUsrLibWhenEtcHasNone) {
  FakeRoot root;
  root.Write("usr/lib/os-release", "ID='ubuntu'\nVERSION_ID=\"24.04\"\n");
  auto claims = CollectInventory({root.path(), "", nullptr, 0});
  EXPECT_EQ(claims.os().id(), "ubuntu");
  EXPECT_EQ(claims.os().version_id(), "24.04");
}

TEST(Inventory, JsonUsesProtoFieldNamesAndRoundTrips) {
  FakeRoot root;
  root.PopulateServer();
  auto claims = CollectInventory({root.path(), "x86_64", nullptr, 5});
  std::string json = InventoryToJson(claims);
  EXPECT_NE(json.find("\"machine_id\": \"0123456789abcdef0123456789abcdef\""), std::string::npos);
  bettercompute::common::v1::HardwareClaims parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &parsed).ok());
  EXPECT_EQ(parsed.SerializeAsString(), claims.SerializeAsString());
}

TEST(Inventory, RealMachineAgreesWithTheKernelsOtherAnswers) {
  utsname uts{};
  ASSERT_EQ(uname(&uts), 0);
  struct sysinfo info {};
  ASSERT_EQ(sysinfo(&info), 0);
  char hostname[256] = {};
  ASSERT_EQ(gethostname(hostname, sizeof hostname - 1), 0);
  SubprocessRunner runner;
  auto claims = CollectInventory({"/", uts.machine, &runner, 0});
  EXPECT_EQ(claims.hostname(), hostname);
  EXPECT_EQ(claims.os().kernel_release(), uts.release);
  EXPECT_EQ(claims.os().kernel_version(), uts.version);
  EXPECT_EQ(claims.memory_bytes(), uint64_t{info.totalram} * info.mem_unit);
  EXPECT_EQ(claims.cpu().threads(), static_cast<uint32_t>(sysconf(_SC_NPROCESSORS_CONF)));
  EXPECT_GE(claims.cpu().cores(), 1u);
  EXPECT_FALSE(claims.os().id().empty());
}

TEST(ParseCpuInfo, CountsWithoutTopologyFields) {
  // ARM and some VMs have no physical id or core id lines.
  auto cpu = ParseCpuInfo("processor : 0\nCPU implementer : 0x41\n\nprocessor : 1\n\n");
  EXPECT_EQ(cpu.threads(), 2u);
  EXPECT_EQ(cpu.cores(), 2u);
  EXPECT_EQ(cpu.sockets(), 1u);
  EXPECT_EQ(cpu.vendor(), "0x41");
}

TEST(ParseMemTotalBytes, ReadsKibibytes) {
  EXPECT_EQ(ParseMemTotalBytes("MemFree: 1 kB\nMemTotal:   16 kB\n"), 16384u);
  EXPECT_EQ(ParseMemTotalBytes("garbage"), 0u);
}

TEST(ParseNvidiaSmi, ReadsRowsAndSkipsMalformedOnes) {
  auto gpus = ParseNvidiaSmi(std::string(kSmiOutput) +
                             "1, GPU-x, NVIDIA H200, [N/A], 143771, 550.54.15, 00000000:2A:00.0\n"
                             "garbage line\n\n");
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].index, 0u);
  EXPECT_EQ(gpus[0].pci_address, "0000:18:00.0");
  EXPECT_EQ(gpus[1].index, 1u);
  EXPECT_EQ(gpus[1].serial, "");
  EXPECT_EQ(gpus[1].pci_address, "0000:2a:00.0");
}

TEST(SubprocessRunner, ReturnsStdout) {
  SubprocessRunner runner;
  auto out = runner.Run({"sh", "-c", "echo hello; echo ignored >&2"}, std::chrono::seconds(10));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "hello\n");
}

TEST(SubprocessRunner, MissingProgramIsNotFound) {
  SubprocessRunner runner;
  auto out = runner.Run({"bcd-no-such-program"}, std::chrono::seconds(10));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ToStd(out.status().message()), "bcd-no-such-program: not found");
}

TEST(SubprocessRunner, NonZeroExitIsAnError) {
  SubprocessRunner runner;
  auto out = runner.Run({"sh", "-c", "exit 3"}, std::chrono::seconds(10));
  EXPECT_EQ(ToStd(out.status().message()), "sh: exited with status 3");
}

TEST(SubprocessRunner, KillsAProgramPastItsTimeout) {
  SubprocessRunner runner;
  auto out = runner.Run({"sleep", "30"}, std::chrono::milliseconds(100));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(ToStd(out.status().message()), "sleep: ran past its 100 ms limit and was killed");
}

TEST(SubprocessRunner, BoundsTheOutput) {
  SubprocessRunner runner;
  auto out = runner.Run({"sh", "-c", "head -c 100000 /dev/zero"}, std::chrono::seconds(10), 1000);
  EXPECT_EQ(ToStd(out.status().message()), "sh: printed more than 1000 bytes");
}

}  // namespace
}  // namespace bcd
