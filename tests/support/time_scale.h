#pragma once

#include <cstdlib>

// How much slower than this host the test's processes run
// (ECCL_TEST_TIMEOUT_SCALE, default 1): the Soft-RoCE VM's emulated CPUs on
// a loaded host set it, and tests whose short deadlines cover connecting
// scale them by it.
inline int timeScale() {
  const char* v = std::getenv("ECCL_TEST_TIMEOUT_SCALE");
  const int scale = v ? std::atoi(v) : 1;
  return scale >= 1 ? scale : 1;
}
