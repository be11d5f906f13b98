#include "coll/algorithms.h"
#include "coll/reduce.h"
#include "common/copy.h"

namespace eccl::coll {

void reduceScatterRing(Links& links, const void* in, void* out, size_t recvCount, ecclDataType_t type,
                       ecclRedOp_t op) {
  const int n = links.size(), r = links.rank();
  const size_t es = typeSize(type);
  Blocks blocks = Blocks::uniform(recvCount, n);
  // Partial sums of other ranks' blocks pass through here on their way round.
  uint8_t* acc = links.scratch(kAccumulatorScratchSlot, recvCount * n * es);
  ringReduceScatter(links, in, acc, blocks, type, op, /*phase=*/0);
  if (recvCount) moveBytes(out, acc + blocks.offsets[r] * es, recvCount * es);
}

}  // namespace eccl::coll
