#pragma once

// Hardware claims of this machine, collected from /proc, /sys and /etc under a root directory, so
// tests run the same code against a fake tree. Collection never fails as a whole: a fact that
// cannot be read (no DMI in a VM, a serial only root may read) is left empty.
//
// Blocking file I/O and, where an NVIDIA GPU is on the PCI bus, one nvidia-smi run: call it off any
// event loop.

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "base/subprocess.h"
#include "bettercompute/common/v1/common.pb.h"

namespace bcd {

struct InventorySources {
  std::filesystem::path root = "/";  // /proc, /sys and /etc are read below this
  std::string architecture;          // uname -m of the running kernel
  CommandRunner* runner = nullptr;   // runs nvidia-smi; nullptr never runs anything
  uint64_t now = 0;                  // unix seconds, recorded as collected_at
};

bettercompute::common::v1::HardwareClaims CollectInventory(const InventorySources& sources);

// The claims as indented JSON with the .proto field names (the protobuf JSON mapping).
std::string InventoryToJson(const bettercompute::common::v1::HardwareClaims& claims);

// Pure parsers of the files and tool output the collector reads.
bettercompute::common::v1::CpuInfo ParseCpuInfo(std::string_view cpuinfo);
uint64_t ParseMemTotalBytes(std::string_view meminfo);
bettercompute::common::v1::OsInfo ParseOsRelease(std::string_view os_release);

// One row of `nvidia-smi --query-gpu=index,uuid,name,serial,memory.total,driver_version,pci.bus_id
// --format=csv,noheader,nounits`; malformed rows are skipped.
struct NvidiaSmiGpu {
  uint32_t index = 0;
  std::string uuid, name, serial, driver_version;
  uint64_t memory_bytes = 0;
  std::string pci_address;  // normalised to dddd:bb:dd.f, lowercase
};
std::vector<NvidiaSmiGpu> ParseNvidiaSmi(std::string_view csv);

}  // namespace bcd
