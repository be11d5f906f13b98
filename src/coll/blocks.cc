#include <algorithm>

#include "coll/algorithms.h"

namespace eccl::coll {

size_t Blocks::maxSize() const {
  size_t m = 0;
  for (size_t b = 0; b + 1 < offsets.size(); ++b) m = std::max(m, offsets[b + 1] - offsets[b]);
  return m;
}

Blocks Blocks::even(size_t count, int n) {
  Blocks out;
  out.offsets.resize(n + 1);
  size_t base = count / n, extra = count % n;
  for (int b = 0; b < n; ++b) out.offsets[b + 1] = out.offsets[b] + base + (static_cast<size_t>(b) < extra ? 1 : 0);
  return out;
}

Blocks Blocks::uniform(size_t blockCount, int n) {
  Blocks out;
  out.offsets.resize(n + 1);
  for (int b = 0; b <= n; ++b) out.offsets[b] = blockCount * b;
  return out;
}

}  // namespace eccl::coll
