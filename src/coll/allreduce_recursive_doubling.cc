#include <cstring>

#include "coll/algorithms.h"
#include "coll/reduce.h"

namespace eccl::coll {

// Latency-optimal for small vectors: log2(n) exchanges of the whole vector.
// A non-power-of-two rank count first folds the extra ranks into their
// neighbours. Each pair reduces (lower rank's data) op (higher rank's data),
// so both partners compute identical bits.
void allreduceRecursiveDoubling(Links& links, const void* in, void* outv, size_t count, ecclDataType_t type,
                                ecclRedOp_t op) {
  const int n = links.size(), r = links.rank();
  const size_t bytes = count * typeSize(type);
  auto* out = static_cast<uint8_t*>(outv);
  if (out != in && bytes) std::memcpy(out, in, bytes);
  if (n == 1) return;
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int extra = n - p;
  uint8_t* tmp = links.scratch(kRingScratchSlot, bytes);  // the ring is not running
  RequestPtr reqs[2];  // on the stack: a small op allocates nothing here
  int virtualRank;
  if (r < 2 * extra) {
    if (r % 2 == 0) {  // folded: hand the data over, wait for the answer
      reqs[0] = links.isend(r + 1, makeTag(0, 0, 0), out, bytes);
      reqs[1] = links.irecv(r + 1, makeTag(2, 0, 0), out, bytes);
      links.waitAll(reqs);
      return;
    }
    reqs[0] = links.irecv(r - 1, makeTag(0, 0, 0), tmp, bytes);
    links.waitAll(reqs);
    reduce(out, tmp, out, count, type, op);
    virtualRank = r / 2;
  } else {
    virtualRank = r - extra;
  }
  auto realRank = [&](int v) { return v < extra ? 2 * v + 1 : v + extra; };
  for (int mask = 1, step = 0; mask < p; mask <<= 1, ++step) {
    int partnerVirtual = virtualRank ^ mask;
    int partner = realRank(partnerVirtual);
    reqs[0] = links.irecv(partner, makeTag(1, step, 0), tmp, bytes);
    reqs[1] = links.isend(partner, makeTag(1, step, 0), out, bytes);
    links.waitAll(reqs);
    if (partnerVirtual < virtualRank)
      reduce(out, tmp, out, count, type, op);
    else
      reduce(out, out, tmp, count, type, op);
  }
  if (r < 2 * extra) {
    reqs[0] = links.isend(r - 1, makeTag(2, 0, 0), out, bytes);
    links.waitAll(reqs);
  }
}

}  // namespace eccl::coll
