#include "modes/common/inventory.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <set>
#include <sstream>
#include <system_error>
#include <utility>

#include "google/protobuf/util/json_util.h"

namespace bcd {
namespace {

namespace fs = std::filesystem;
namespace pb = bettercompute::common::v1;

constexpr std::size_t kMaxFileBytes = 1 << 20;

// The file's content (at most kMaxFileBytes), or "" when it cannot be read.
std::string ReadFile(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return "";
  std::string out;
  char buffer[4096];
  while (out.size() < kMaxFileBytes) {
    file.read(buffer, sizeof buffer);
    auto n = static_cast<std::size_t>(file.gcount());
    if (n == 0) break;
    out.append(buffer, std::min(n, kMaxFileBytes - out.size()));
  }
  return out;
}

std::string_view Trim(std::string_view text) {
  constexpr std::string_view kSpace = " \t\r\n";
  std::size_t start = text.find_first_not_of(kSpace);
  if (start == std::string_view::npos) return {};
  return text.substr(start, text.find_last_not_of(kSpace) - start + 1);
}

// A sysfs attribute, trimmed; "" when absent or unreadable.
std::string ReadAttr(const fs::path& path) { return std::string(Trim(ReadFile(path))); }

template <typename T>
T ParseNumber(std::string_view text, int base = 10) {
  text = Trim(text);
  if (base == 16 && (text.starts_with("0x") || text.starts_with("0X"))) text.remove_prefix(2);
  T value{};
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value, base);
  return ec == std::errc() ? value : T{};
}

std::vector<std::string_view> Lines(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    std::size_t nl = text.find('\n');
    lines.push_back(text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return lines;
}

// Sorted directory entries; empty when the directory does not exist.
std::vector<fs::path> ListDir(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    out.push_back(it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The last path component a symlink points to ("" when it is not a link).
std::string LinkTarget(const fs::path& link) {
  std::error_code ec;
  fs::path target = fs::read_symlink(link, ec);
  return ec ? "" : target.filename().string();
}

// "00000000:3B:00.0" (nvidia-smi) or "0000:3b:00.0" (sysfs) as "0000:3b:00.0".
std::string NormalizePciAddress(std::string_view address) {
  std::string out(Trim(address));
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::size_t colon = out.find(':');
  if (colon != std::string::npos && colon > 4) out.erase(0, colon - 4);
  return out;
}

std::string MachineId(const fs::path& root) {
  std::string id = ReadAttr(root / "etc/machine-id");
  bool valid = id.size() == 32 && std::all_of(id.begin(), id.end(), [](char c) {
                 return std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f');
               });
  return valid ? id : "";
}

pb::DmiInfo CollectDmi(const fs::path& root) {
  fs::path dir = root / "sys/class/dmi/id";
  pb::DmiInfo dmi;
  dmi.set_vendor(ReadAttr(dir / "sys_vendor"));
  dmi.set_product(ReadAttr(dir / "product_name"));
  dmi.set_serial(ReadAttr(dir / "product_serial"));
  dmi.set_uuid(ReadAttr(dir / "product_uuid"));
  dmi.set_board_vendor(ReadAttr(dir / "board_vendor"));
  dmi.set_board_product(ReadAttr(dir / "board_name"));
  dmi.set_board_serial(ReadAttr(dir / "board_serial"));
  dmi.set_chassis_serial(ReadAttr(dir / "chassis_serial"));
  dmi.set_bios_vendor(ReadAttr(dir / "bios_vendor"));
  dmi.set_bios_version(ReadAttr(dir / "bios_version"));
  return dmi;
}

// SCSI VPD page 0x80 (unit serial number): 4 header bytes, byte 3 the length, then ASCII.
std::string SerialFromVpd80(std::string_view page) {
  if (page.size() < 4) return "";
  std::size_t length = static_cast<unsigned char>(page[3]);
  return std::string(Trim(page.substr(4, length)));
}

bool SkipBlockDevice(const std::string& name) {
  for (std::string_view prefix : {"loop", "ram", "zram", "dm-", "nbd", "fd"}) {
    if (name.starts_with(prefix)) return true;
  }
  return false;
}

void CollectBlockDevices(const fs::path& root, pb::HardwareClaims* claims) {
  for (const fs::path& dir : ListDir(root / "sys/block")) {
    std::string name = dir.filename().string();
    uint64_t sectors = ParseNumber<uint64_t>(ReadAttr(dir / "size"));
    if (SkipBlockDevice(name) || sectors == 0) continue;
    pb::BlockDevice* dev = claims->add_block_devices();
    dev->set_name(name);
    dev->set_size_bytes(sectors * 512);  // sysfs counts 512-byte sectors whatever the block size
    dev->set_model(ReadAttr(dir / "device/model"));
    std::string serial = ReadAttr(dir / "serial");
    if (serial.empty()) serial = ReadAttr(dir / "device/serial");
    if (serial.empty()) serial = SerialFromVpd80(ReadFile(dir / "device/vpd_pg80"));
    dev->set_serial(serial);
    std::string wwn = ReadAttr(dir / "wwid");
    if (wwn.empty()) wwn = ReadAttr(dir / "device/wwid");
    dev->set_wwn(wwn);
    dev->set_rotational(ReadAttr(dir / "queue/rotational") == "1");
    dev->set_removable(ReadAttr(dir / "removable") == "1");
  }
}

void CollectNetwork(const fs::path& root, pb::HardwareClaims* claims) {
  constexpr std::string_view kLoopbackType = "772";  // ARPHRD_LOOPBACK
  for (const fs::path& dir : ListDir(root / "sys/class/net")) {
    if (ReadAttr(dir / "type") == kLoopbackType || dir.filename() == "lo") continue;
    pb::NetworkInterface* nic = claims->add_network_interfaces();
    nic->set_name(dir.filename().string());
    nic->set_mac(ReadAttr(dir / "address"));
    nic->set_mtu(ParseNumber<uint32_t>(ReadAttr(dir / "mtu")));
    int64_t speed = ParseNumber<int64_t>(ReadAttr(dir / "speed"));  // -1 or unreadable when down
    nic->set_speed_mbps(speed > 0 ? static_cast<uint32_t>(speed) : 0);
    nic->set_operstate(ReadAttr(dir / "operstate"));
    std::error_code ec;
    nic->set_physical(fs::exists(dir / "device", ec));
    if (LinkTarget(dir / "device/subsystem") == "pci") {
      nic->set_pci_address(NormalizePciAddress(LinkTarget(dir / "device")));
    }
    nic->set_driver(LinkTarget(dir / "device/driver"));
  }
}

void CollectGpus(const InventorySources& sources, pb::HardwareClaims* claims) {
  constexpr uint32_t kNvidia = 0x10de;
  for (const fs::path& dir : ListDir(sources.root / "sys/bus/pci/devices")) {
    uint32_t vendor = ParseNumber<uint32_t>(ReadAttr(dir / "vendor"), 16);
    uint32_t pci_class = ParseNumber<uint32_t>(ReadAttr(dir / "class"), 16);
    if (vendor != kNvidia || (pci_class >> 16) != 0x03) continue;  // 0x03: display controllers
    pb::Gpu* gpu = claims->add_gpus();
    gpu->set_pci_address(NormalizePciAddress(dir.filename().string()));
    gpu->set_vendor_id(vendor);
    gpu->set_device_id(ParseNumber<uint32_t>(ReadAttr(dir / "device"), 16));
    std::string numa = ReadAttr(dir / "numa_node");
    gpu->set_numa_node(numa.empty() ? -1 : ParseNumber<int32_t>(numa));
  }
  if (claims->gpus().empty() || sources.runner == nullptr) return;
  absl::StatusOr<std::string> csv = sources.runner->Run(
      {"nvidia-smi", "--query-gpu=index,uuid,name,serial,memory.total,driver_version,pci.bus_id",
       "--format=csv,noheader,nounits"},
      std::chrono::seconds(10));
  if (!csv.ok()) return;  // no driver or no tool: the PCI facts stand alone
  for (const NvidiaSmiGpu& row : ParseNvidiaSmi(*csv)) {
    for (pb::Gpu& gpu : *claims->mutable_gpus()) {
      if (gpu.pci_address() != row.pci_address) continue;
      gpu.set_index(row.index);
      gpu.set_uuid(row.uuid);
      gpu.set_name(row.name);
      gpu.set_serial(row.serial);
      gpu.set_memory_bytes(row.memory_bytes);
      gpu.set_driver_version(row.driver_version);
    }
  }
}

}  // namespace

pb::CpuInfo ParseCpuInfo(std::string_view cpuinfo) {
  pb::CpuInfo cpu;
  uint32_t threads = 0;
  std::set<std::string> sockets;
  std::set<std::pair<std::string, std::string>> cores;
  std::string physical_id;
  for (std::string_view line : Lines(cpuinfo)) {
    std::size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    std::string_view key = Trim(line.substr(0, colon));
    std::string_view value = Trim(line.substr(colon + 1));
    if (key == "processor") {
      ++threads;
      physical_id.clear();
    } else if (key == "model name" && cpu.model().empty()) {
      cpu.set_model(std::string(value));
    } else if ((key == "vendor_id" || key == "CPU implementer") && cpu.vendor().empty()) {
      cpu.set_vendor(std::string(value));
    } else if (key == "physical id") {
      physical_id = std::string(value);
      sockets.insert(physical_id);
    } else if (key == "core id") {
      cores.emplace(physical_id, std::string(value));
    }
  }
  cpu.set_threads(threads);
  cpu.set_sockets(sockets.empty() ? (threads > 0 ? 1 : 0) : static_cast<uint32_t>(sockets.size()));
  cpu.set_cores(cores.empty() ? threads : static_cast<uint32_t>(cores.size()));
  return cpu;
}

uint64_t ParseMemTotalBytes(std::string_view meminfo) {
  for (std::string_view line : Lines(meminfo)) {
    if (!line.starts_with("MemTotal:")) continue;
    std::string_view value = Trim(line.substr(9));
    uint64_t kib = ParseNumber<uint64_t>(value.substr(0, value.find(' ')));
    return kib * 1024;
  }
  return 0;
}

pb::OsInfo ParseOsRelease(std::string_view os_release) {
  pb::OsInfo os;
  for (std::string_view line : Lines(os_release)) {
    std::size_t eq = line.find('=');
    if (eq == std::string_view::npos || line.starts_with('#')) continue;
    std::string_view key = Trim(line.substr(0, eq));
    std::string_view value = Trim(line.substr(eq + 1));
    if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') &&
        value.back() == value.front()) {
      value = value.substr(1, value.size() - 2);
    }
    if (key == "ID") os.set_id(std::string(value));
    if (key == "VERSION_ID") os.set_version_id(std::string(value));
    if (key == "PRETTY_NAME") os.set_pretty_name(std::string(value));
  }
  return os;
}

std::vector<NvidiaSmiGpu> ParseNvidiaSmi(std::string_view csv) {
  std::vector<NvidiaSmiGpu> gpus;
  for (std::string_view line : Lines(csv)) {
    std::vector<std::string_view> cells;
    for (std::size_t start = 0;;) {
      std::size_t comma = line.find(',', start);
      cells.push_back(
          Trim(line.substr(start, comma == std::string_view::npos ? comma : comma - start)));
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    if (cells.size() != 7 || cells[0].empty() || cells[6].empty()) continue;
    auto known = [](std::string_view v) {
      return v.starts_with('[') ? std::string() : std::string(v);
    };
    NvidiaSmiGpu gpu;
    gpu.index = ParseNumber<uint32_t>(cells[0]);
    gpu.uuid = known(cells[1]);
    gpu.name = known(cells[2]);
    gpu.serial = known(cells[3]);
    gpu.memory_bytes = ParseNumber<uint64_t>(cells[4]) * 1024 * 1024;  // MiB with nounits
    gpu.driver_version = known(cells[5]);
    gpu.pci_address = NormalizePciAddress(cells[6]);
    gpus.push_back(std::move(gpu));
  }
  return gpus;
}

pb::HardwareClaims CollectInventory(const InventorySources& sources) {
  const fs::path& root = sources.root;
  pb::HardwareClaims claims;
  claims.set_hostname(ReadAttr(root / "proc/sys/kernel/hostname"));
  claims.set_machine_id(MachineId(root));
  *claims.mutable_dmi() = CollectDmi(root);
  *claims.mutable_cpu() = ParseCpuInfo(ReadFile(root / "proc/cpuinfo"));
  claims.mutable_cpu()->set_architecture(sources.architecture);
  claims.set_memory_bytes(ParseMemTotalBytes(ReadFile(root / "proc/meminfo")));
  CollectBlockDevices(root, &claims);
  CollectNetwork(root, &claims);
  CollectGpus(sources, &claims);
  std::string os_release = ReadFile(root / "etc/os-release");
  if (os_release.empty()) os_release = ReadFile(root / "usr/lib/os-release");
  *claims.mutable_os() = ParseOsRelease(os_release);
  claims.mutable_os()->set_kernel_release(ReadAttr(root / "proc/sys/kernel/osrelease"));
  claims.mutable_os()->set_kernel_version(ReadAttr(root / "proc/sys/kernel/version"));
  claims.set_collected_at(sources.now);
  return claims;
}

std::string InventoryToJson(const pb::HardwareClaims& claims) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  std::string json;
  // Printing a valid message with the generated descriptor cannot fail.
  (void)google::protobuf::util::MessageToJsonString(claims, &json, options);
  return json;
}

}  // namespace bcd
