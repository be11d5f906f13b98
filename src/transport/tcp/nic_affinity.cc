#include "transport/tcp/nic_affinity.h"

#include <hwloc.h>

#include <unistd.h>

#include <cstring>
#include <mutex>

#include "common/log.h"

namespace eccl::transport {

namespace {

// One topology per process: loading it walks sysfs and costs milliseconds.
hwloc_topology_t topology() {
  static hwloc_topology_t topo = [] {
    hwloc_topology_t t = nullptr;
    if (hwloc_topology_init(&t) != 0) return static_cast<hwloc_topology_t>(nullptr);
    hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    // NICs come from sysfs. The GPU plugins are not needed and are costly:
    // the GL one opens an X display (a TCP connection to port 6000 from
    // every rank), the others initialise device runtimes.
    for (const char* plugin : {"gl", "opencl", "cuda", "nvml", "rsmi", "levelzero"})
      hwloc_topology_set_components(t, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, plugin);
    if (hwloc_topology_load(t) != 0) {
      hwloc_topology_destroy(t);
      return static_cast<hwloc_topology_t>(nullptr);
    }
    return t;
  }();
  return topo;
}

// Only an interface backed by a bus device has a place in the topology;
// loopback, veth, bridges and tunnels have none, and loading hwloc's
// topology costs up to a second per process under a sanitizer on a busy
// machine, so it is not loaded for them.
bool hasDevice(const std::string& ifname) {
  return !ifname.empty() && ifname.find('/') == std::string::npos &&
         access(("/sys/class/net/" + ifname + "/device").c_str(), F_OK) == 0;
}

}  // namespace

void loadNicTopology(const std::string& ifname) {
  if (hasDevice(ifname)) (void)topology();
}

void bindThreadNearNic(const std::string& ifname) {
  if (!hasDevice(ifname)) {
    log::info("interface {} is not a device on a bus (virtual or loopback); progress thread left unbound", ifname);
    return;
  }
  hwloc_topology_t topo = topology();
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (!topo) {
    log::info("hwloc topology unavailable; progress thread left unbound");
    return;
  }
  for (hwloc_obj_t os = hwloc_get_next_osdev(topo, nullptr); os; os = hwloc_get_next_osdev(topo, os)) {
    if (!os->name || ifname != os->name) continue;
    hwloc_obj_t near = hwloc_get_non_io_ancestor_obj(topo, os);
    if (!near || !near->cpuset) break;
    if (hwloc_set_cpubind(topo, near->cpuset, HWLOC_CPUBIND_THREAD) == 0) {
      char* text = nullptr;
      hwloc_bitmap_asprintf(&text, near->cpuset);
      log::info("progress thread bound near {} (cpuset {})", ifname, text ? text : "?");
      free(text);
    }
    return;
  }
  log::info("interface {} has no NUMA locality in hwloc (virtual or loopback); progress thread left unbound",
            ifname);
}

}  // namespace eccl::transport
