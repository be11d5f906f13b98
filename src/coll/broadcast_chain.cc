#include <algorithm>
#include <vector>

#include "coll/algorithms.h"
#include "common/copy.h"

namespace eccl::coll {

// Pipelined chain root -> root+1 -> ...: each rank forwards a segment as
// soon as it has it, so time is about (n-1 + segments) segment transfers.
void broadcastChain(Links& links, const void* in, void* outv, size_t bytes, int root) {
  const int n = links.size(), r = links.rank();
  auto* out = static_cast<uint8_t*>(outv);
  if (r == root && out != in && bytes) moveBytes(out, in, bytes);
  if (n == 1) return;
  const int pos = modRank(r - root, n), next = modRank(r + 1, n), prev = modRank(r - 1, n);
  const size_t seg = std::max<size_t>(links.segmentBytes(), (bytes + kMaxSegments - 1) / kMaxSegments);
  const size_t segments = std::max<size_t>(1, (bytes + seg - 1) / seg);
  auto len = [&](size_t k) { return std::min(seg, bytes - std::min(bytes, k * seg)); };
  std::vector<RequestPtr> recvs, sends;
  if (pos > 0)
    for (size_t k = 0; k < segments; ++k) recvs.push_back(links.irecv(prev, makeTag(0, 0, k), out + k * seg, len(k)));
  for (size_t k = 0; k < segments; ++k) {
    if (pos > 0) links.wait(recvs[k]);
    if (pos < n - 1) sends.push_back(links.isend(next, makeTag(0, 0, k), out + k * seg, len(k)));
  }
  links.waitAll(sends);
}

}  // namespace eccl::coll
