#include "coll/algorithms.h"
#include "coll/reduce.h"
#include "common/copy.h"

namespace eccl::coll {

bool foldExtraRank(Links& links, const DoublingLayout& layout, uint8_t* out, uint8_t* tmp, size_t count,
                   ecclDataType_t type, ecclRedOp_t op, uint32_t answerTag) {
  const int r = links.rank();
  const size_t bytes = count * typeSize(type);
  RequestPtr reqs[2];
  if (layout.folded(r)) {  // hand the data over, wait for the answer
    reqs[0] = links.isend(r + 1, makeTag(0, 0, 0), out, bytes);
    reqs[1] = links.irecv(r + 1, answerTag, out, bytes);
    links.waitAll(reqs);
    return false;
  }
  if (layout.pairedBelowExtra(r)) {
    reqs[0] = links.irecv(r - 1, makeTag(0, 0, 0), tmp, bytes);
    links.waitAll(reqs);
    reduce(out, tmp, out, count, type, op);
  }
  return true;
}

void answerFoldedRank(Links& links, const DoublingLayout& layout, const uint8_t* out, size_t bytes,
                      uint32_t answerTag) {
  const int r = links.rank();
  if (!layout.pairedBelowExtra(r)) return;
  RequestPtr reqs[1];
  reqs[0] = links.isend(r - 1, answerTag, out, bytes);
  links.waitAll(reqs);
}

// Latency-optimal for small vectors: log2(n) exchanges of the whole vector.
// A non-power-of-two rank count first folds the extra ranks into their
// neighbours. Each pair reduces (lower rank's data) op (higher rank's data),
// so both partners compute identical bits. Out of place, the first
// exchange sends the input itself and reduces into the output, so no rank
// outside the fold copies its input first.
void allreduceRecursiveDoubling(Links& links, const void* in, void* outv, size_t count, ecclDataType_t type,
                                ecclRedOp_t op) {
  const int n = links.size(), r = links.rank();
  const size_t bytes = count * typeSize(type);
  auto* out = static_cast<uint8_t*>(outv);
  const DoublingLayout layout(n);
  const uint8_t* mine = static_cast<const uint8_t*>(in);  // this rank's running value
  if (out != in && bytes && (n == 1 || layout.pairedBelowExtra(r))) copyBytes(out, in, bytes), mine = out;
  if (n == 1) return;
  uint8_t* tmp = links.scratch(kRingScratchSlot, bytes);  // the ring is not running
  if (layout.extra && !foldExtraRank(links, layout, out, tmp, count, type, op, makeTag(2, 0, 0))) return;
  const int virtualRank = layout.virtualRank(r);
  for (int mask = 1, step = 0; mask < layout.p; mask <<= 1, ++step) {
    const int partnerVirtual = virtualRank ^ mask;
    const int partner = layout.realRank(partnerVirtual);
    links.exchangeAndUse(partner, makeTag(1, step, 0), mine, bytes, tmp, bytes, [&](const uint8_t* theirs) {
      if (partnerVirtual < virtualRank)
        reduce(out, theirs, mine, count, type, op);
      else
        reduce(out, mine, theirs, count, type, op);
    });
    mine = out;
  }
  if (layout.extra) answerFoldedRank(links, layout, out, bytes, makeTag(2, 0, 0));
}

}  // namespace eccl::coll
