#pragma once

#include <string>

namespace eccl::transport {

// Binds the calling thread to the CPUs of the NUMA node closest to the
// network interface `ifname`, when hwloc knows where that NIC sits.
void bindThreadNearNic(const std::string& ifname);

}  // namespace eccl::transport
