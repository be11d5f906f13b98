#include "net_plugin/nic.h"

#include <hwloc.h>
#include <limits.h>
#include <stdlib.h>

#include <fstream>

#include "common/log.h"
#include "common/netif.h"
#include "common/params.h"

namespace eccl::netplugin {
namespace {

std::string pciPathOf(const std::string& ifname) {
  hwloc_topology_t topo = nullptr;
  if (hwloc_topology_init(&topo) != 0) return {};
  hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  for (const char* plugin : {"gl", "opencl", "cuda", "nvml", "rsmi", "levelzero"})
    hwloc_topology_set_components(topo, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, plugin);
  std::string path;
  if (hwloc_topology_load(topo) == 0) {
    for (hwloc_obj_t os = hwloc_get_next_osdev(topo, nullptr); os; os = hwloc_get_next_osdev(topo, os)) {
      if (!os->name || ifname != os->name) continue;
      hwloc_obj_t pci = os->parent;
      while (pci && pci->type != HWLOC_OBJ_PCI_DEVICE) pci = pci->parent;
      if (!pci) break;
      const auto& a = pci->attr->pcidev;
      std::string sys = fmt::format("/sys/bus/pci/devices/{:04x}:{:02x}:{:02x}.{:x}", a.domain, a.bus, a.dev, a.func);
      char resolved[PATH_MAX];
      if (realpath(sys.c_str(), resolved)) path = resolved;
      break;
    }
  }
  hwloc_topology_destroy(topo);
  return path;
}

int speedOf(const std::string& ifname) {
  std::ifstream in("/sys/class/net/" + ifname + "/speed");
  int mbps = 0;
  if (in >> mbps && mbps > 0) return mbps;
  return 10000;  // loopback, veth and the like report none
}

}  // namespace

const NicFacts& nicFacts() {
  static const NicFacts facts = [] {
    NicFacts f;
    NetInterface nic = pickInterface(params::socketIfname());
    f.name = "eccl:" + nic.name;
    f.pciPath = pciPathOf(nic.name);
    f.speedMbps = speedOf(nic.name);
    // The same interface gives the same guid in every process of a host.
    uint64_t h = 1469598103934665603ull;
    for (char c : nic.name + nic.addr.str()) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
    f.guid = h;
    log::info("net plugin: NIC {} ({} Mbps{}{})", f.name, f.speedMbps, f.pciPath.empty() ? "" : ", ", f.pciPath);
    return f;
  }();
  return facts;
}

}  // namespace eccl::netplugin
