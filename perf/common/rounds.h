// What the benchmarks that time alternating rounds share: the median of a
// round's figures (the upper one of an even count), elapsed seconds, and a
// C API check that ends the benchmark with the call's error.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "eccl.h"

namespace eccl::perf {

inline double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Seconds since `since` on the steady clock.
inline double secondsSince(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

inline void checkOrExit(const char* tool, ecclResult_t r, ecclComm_t comm, const char* what) {
  if (r == ecclSuccess) return;
  fprintf(stderr, "%s: %s: %s: %s\n", tool, what, ecclGetErrorString(r), ecclGetLastError(comm));
  exit(1);
}

}  // namespace eccl::perf
