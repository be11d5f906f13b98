// dispatch_perf's GPU section: the CUDA permute and combine kernels against
// a device-to-device copy of the same bytes and against the HBM peak.
#pragma once

namespace eccl::perf {

// Prints the table (or JSON lines); one line saying why when the build has
// no CUDA or the machine no GPU.
void dispatchCudaSection(bool json, double hbmGBs);

}  // namespace eccl::perf
