#pragma once

// A fake machine: a temp directory with the /proc, /sys and /etc files inventory reads.

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace bcd::testing {

class FakeRoot {
 public:
  FakeRoot() {
    std::string pattern =
        (std::filesystem::path(::testing::TempDir()) / "bcd-root-XXXXXX").string();
    root_ = mkdtemp(pattern.data());
  }
  ~FakeRoot() { std::filesystem::remove_all(root_); }
  FakeRoot(const FakeRoot&) = delete;
  FakeRoot& operator=(const FakeRoot&) = delete;

  const std::filesystem::path& path() const { return root_; }

  void Write(const std::string& relative, const std::string& content) const {
    std::filesystem::path file = root_ / relative;
    std::filesystem::create_directories(file.parent_path());
    std::ofstream(file, std::ios::binary) << content;
  }

  void Link(const std::string& relative, const std::string& target) const {
    std::filesystem::path link = root_ / relative;
    std::filesystem::create_directories(link.parent_path());
    std::filesystem::create_symlink(target, link);
  }

  // A two-socket machine with two disks, two NICs and one NVIDIA GPU.
  void PopulateServer() const {
    Write("proc/sys/kernel/hostname", "gpu-node-7\n");
    Write("proc/sys/kernel/osrelease", "6.1.0-18-amd64\n");
    Write("proc/sys/kernel/version", "#1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1\n");
    Write("etc/machine-id", "0123456789abcdef0123456789abcdef\n");
    Write("etc/os-release",
          "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nNAME=\"Debian GNU/Linux\"\n"
          "VERSION_ID=\"12\"\nID=debian\n");
    Write("sys/class/dmi/id/sys_vendor", "Supermicro\n");
    Write("sys/class/dmi/id/product_name", "SYS-821GE-TNHR\n");
    Write("sys/class/dmi/id/product_serial", "S123456X\n");
    Write("sys/class/dmi/id/board_vendor", "Supermicro\n");
    Write("sys/class/dmi/id/board_name", "X13DEG-OAD\n");
    Write("sys/class/dmi/id/bios_version", "2.1\n");
    std::string cpuinfo;
    for (int socket = 0; socket < 2; ++socket) {
      for (int core = 0; core < 2; ++core) {
        for (int thread = 0; thread < 2; ++thread) {
          cpuinfo += "processor\t: " + std::to_string(socket * 4 + core * 2 + thread) + "\n" +
                     "vendor_id\t: GenuineIntel\n"
                     "model name\t: Intel(R) Xeon(R) Platinum 8480+\n"
                     "physical id\t: " +
                     std::to_string(socket) + "\n" + "core id\t\t: " + std::to_string(core) +
                     "\n\n";
        }
      }
    }
    Write("proc/cpuinfo", cpuinfo);
    Write("proc/meminfo", "MemTotal:       2113929216 kB\nMemFree:        1000 kB\n");
    // An NVMe disk, a SATA disk with a VPD serial, and devices that are skipped.
    Write("sys/block/nvme0n1/size", "7501476528\n");
    Write("sys/block/nvme0n1/device/model", "SAMSUNG MZQL27T6HBLA-00A07    \n");
    Write("sys/block/nvme0n1/device/serial", "S6CKNE0T123456\n");
    Write("sys/block/nvme0n1/wwid", "eui.36344830526001230025384500000001\n");
    Write("sys/block/nvme0n1/queue/rotational", "0\n");
    Write("sys/block/nvme0n1/removable", "0\n");
    Write("sys/block/sda/size", "3907029168\n");
    Write("sys/block/sda/device/model", "ST2000NM0055\n");
    Write("sys/block/sda/device/vpd_pg80", std::string("\x00\x80\x00\x08ZC1234AB", 12));
    Write("sys/block/sda/queue/rotational", "1\n");
    Write("sys/block/sda/removable", "0\n");
    Write("sys/block/loop0/size", "1000\n");
    Write("sys/block/sr0/size", "0\n");
    // NICs: a PCI NIC, a virtual bridge and loopback.
    Write("sys/devices/pci0000:00/0000:17:00.0/vendor", "0x15b3\n");
    Link("sys/class/net/eth0/device", "../../../devices/pci0000:00/0000:17:00.0");
    Link("sys/devices/pci0000:00/0000:17:00.0/subsystem", "../../../bus/pci");
    Link("sys/devices/pci0000:00/0000:17:00.0/driver", "../../../bus/pci/drivers/mlx5_core");
    Write("sys/class/net/eth0/address", "b8:3f:d2:00:11:22\n");
    Write("sys/class/net/eth0/mtu", "9000\n");
    Write("sys/class/net/eth0/speed", "100000\n");
    Write("sys/class/net/eth0/operstate", "up\n");
    Write("sys/class/net/eth0/type", "1\n");
    Write("sys/class/net/br0/address", "02:42:ac:11:00:01\n");
    Write("sys/class/net/br0/mtu", "1500\n");
    Write("sys/class/net/br0/speed", "-1\n");
    Write("sys/class/net/br0/operstate", "down\n");
    Write("sys/class/net/br0/type", "1\n");
    Write("sys/class/net/lo/address", "00:00:00:00:00:00\n");
    Write("sys/class/net/lo/type", "772\n");
    // PCI: one NVIDIA GPU, one NVIDIA non-display device (an NVSwitch bridge), one other vendor.
    Write("sys/bus/pci/devices/0000:18:00.0/vendor", "0x10de\n");
    Write("sys/bus/pci/devices/0000:18:00.0/device", "0x2335\n");
    Write("sys/bus/pci/devices/0000:18:00.0/class", "0x030200\n");
    Write("sys/bus/pci/devices/0000:18:00.0/numa_node", "0\n");
    Write("sys/bus/pci/devices/0000:05:00.0/vendor", "0x10de\n");
    Write("sys/bus/pci/devices/0000:05:00.0/device", "0x22a3\n");
    Write("sys/bus/pci/devices/0000:05:00.0/class", "0x068000\n");
    Write("sys/bus/pci/devices/0000:17:00.0/vendor", "0x15b3\n");
    Write("sys/bus/pci/devices/0000:17:00.0/class", "0x020000\n");
  }

 private:
  std::filesystem::path root_;
};

}  // namespace bcd::testing
