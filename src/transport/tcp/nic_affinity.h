#pragma once

#include <string>

namespace eccl::transport {

// Loads the machine's topology once per process where `ifname` is a device
// on a bus (a virtual one has no locality to find). hwloc reads the
// environment while loading, which is unsafe beside a thread that changes
// it (Python's os.environ does, on the application's thread): call this
// from the thread that creates the device, never from a background one.
void loadNicTopology(const std::string& ifname);

// Binds the calling thread to the CPUs of the NUMA node closest to the
// network interface `ifname`, when hwloc knows where that NIC sits.
void bindThreadNearNic(const std::string& ifname);  // after loadNicTopology(ifname)

}  // namespace eccl::transport
