#include <algorithm>
#include <vector>

#include "coll/algorithms.h"
#include "coll/reduce.h"
#include "common/copy.h"

namespace eccl::coll {

// Pipelined chain root+1 -> root+2 -> ... -> root: each rank adds its input
// to the partial it receives and forwards it segment by segment. The order
// of the additions is fixed by the view, so results are deterministic.
void reduceChain(Links& links, const void* inv, void* outv, size_t count, ecclDataType_t type, ecclRedOp_t op,
                 int root) {
  const int n = links.size(), r = links.rank();
  const size_t es = typeSize(type), bytes = count * es;
  auto* in = static_cast<const uint8_t*>(inv);
  if (n == 1) {
    if (outv != inv && bytes) moveBytes(outv, inv, bytes);
    return;
  }
  const int pos = modRank(r - root - 1, n), next = modRank(r + 1, n), prev = modRank(r - 1, n);
  const size_t seg = std::max<size_t>(std::max<size_t>(1, links.segmentBytes() / es),
                                      (count + kMaxSegments - 1) / kMaxSegments);
  const size_t segments = std::max<size_t>(1, (count + seg - 1) / seg);
  auto len = [&](size_t k) { return std::min(seg, count - std::min(count, k * seg)); };
  std::vector<RequestPtr> recvs, sends;
  if (pos == 0) {
    for (size_t k = 0; k < segments; ++k)
      sends.push_back(links.isend(next, makeTag(0, 0, k), in + k * seg * es, len(k) * es));
    links.waitAll(sends);
    return;
  }
  std::vector<uint8_t> incoming(bytes), partial;
  uint8_t* acc = static_cast<uint8_t*>(outv);
  if (r != root) {
    partial.resize(bytes);
    acc = partial.data();
  }
  for (size_t k = 0; k < segments; ++k)
    recvs.push_back(links.irecv(prev, makeTag(0, 0, k), incoming.data() + k * seg * es, len(k) * es));
  for (size_t k = 0; k < segments; ++k) {
    links.wait(recvs[k]);
    size_t off = k * seg * es;
    reduce(acc + off, incoming.data() + off, in + off, len(k), type, op);
    if (r != root) sends.push_back(links.isend(next, makeTag(0, 0, k), acc + off, len(k) * es));
  }
  links.waitAll(sends);
}

}  // namespace eccl::coll
