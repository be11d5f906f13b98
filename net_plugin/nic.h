// The NIC the plugin reports to NCCL: the interface eccl's TCP lanes use
// (ECCL_SOCKET_IFNAME), with its PCI path from hwloc (NCCL places it in its
// topology by it) and its speed from the kernel.
#pragma once

#include <cstdint>
#include <string>

namespace eccl::netplugin {

struct NicFacts {
  std::string name;     // "eccl:eth0"
  std::string pciPath;  // /sys/devices/pci0000:00/...; empty for virtual interfaces
  uint64_t guid = 0;
  int speedMbps = 10000;  // the kernel's figure, or NCCL's socket default when it has none
};

// Found once per process; the strings stay valid for NCCL to keep.
const NicFacts& nicFacts();

}  // namespace eccl::netplugin
