#include "coll/algorithms.h"
#include "coll/reduce.h"

namespace eccl::coll {

// Bandwidth-optimal: each rank sends and receives 2(n-1)/n of the vector.
// The two halves overlap: each segment of a rank's own block goes out to
// the all-gather the moment it is reduced, instead of the link idling
// while the last segments of the reduce-scatter are summed.
void allreduceRing(Links& links, const void* in, void* out, size_t count, ecclDataType_t type,
                   ecclRedOp_t op) {
  Blocks blocks = Blocks::even(count, links.size());
  RingAllGather gather(links, out, blocks, typeSize(type), /*phase=*/1);
  ringReduceScatter(links, in, out, blocks, type, op, /*phase=*/0, [&](size_t k) { gather.sendOwn(k); });
  gather.finish();
}

}  // namespace eccl::coll
