#include "coll/algorithms.h"
#include "coll/reduce.h"

namespace eccl::coll {

// Bandwidth-optimal: each rank sends and receives 2(n-1)/n of the vector.
void allreduceRing(Links& links, const void* in, void* out, size_t count, ecclDataType_t type,
                   ecclRedOp_t op) {
  Blocks blocks = Blocks::even(count, links.size());
  ringReduceScatter(links, in, out, blocks, type, op, /*phase=*/0);
  ringAllGather(links, out, blocks, typeSize(type), /*phase=*/1);
}

}  // namespace eccl::coll
