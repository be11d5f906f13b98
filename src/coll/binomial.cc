#include "coll/algorithms.h"
#include "coll/reduce.h"
#include "common/copy.h"

namespace eccl::coll {
namespace {
constexpr int kMaxRounds = 32;  // log2 of any int rank count
}  // namespace

// Latency trees for small messages: ceil(log2 n) rounds where the chains
// and the ring take n - 1. Ranks are taken relative to the root; a rank
// whose relative number has lowest set bit m hears from (or answers to)
// the rank m below it, and talks to the ranks m/2, m/4, ... above it.

void broadcastBinomial(Links& links, const void* in, void* outv, size_t bytes, int root) {
  const int n = links.size(), r = links.rank();
  auto* out = static_cast<uint8_t*>(outv);
  if (r == root && out != in && bytes) moveBytes(out, in, bytes);
  if (n == 1) return;
  const int v = modRank(r - root, n);
  int mask = 1;
  while (mask < n && !(v & mask)) mask <<= 1;
  if (v != 0) {
    RequestPtr fromParent = links.irecv(modRank(v - mask + root, n), makeTag(0, 0, 0), out, bytes);
    links.wait(fromParent);
  }
  RequestPtr sends[kMaxRounds];
  int children = 0;
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (v + mask < n) sends[children++] = links.isend(modRank(v + mask + root, n), makeTag(0, 0, 0), out, bytes);
  links.waitAll(sends);
}

// Each rank combines (its partial) op (the partial of the subtree above it),
// lower relative rank first, so the order is fixed by the view and the root
// and results are deterministic.
void reduceBinomial(Links& links, const void* inv, void* outv, size_t count, ecclDataType_t type, ecclRedOp_t op,
                    int root) {
  const int n = links.size(), r = links.rank();
  const size_t bytes = count * typeSize(type);
  if (n == 1) {
    if (outv != inv && bytes) moveBytes(outv, inv, bytes);
    return;
  }
  const int v = modRank(r - root, n);
  // The root accumulates in its output; the others in working memory.
  uint8_t* acc = r == root ? static_cast<uint8_t*>(outv) : links.scratch(kAccumulatorScratchSlot, bytes);
  uint8_t* incoming = links.scratch(kRingScratchSlot, bytes);
  if (acc != inv && bytes) moveBytes(acc, inv, bytes);
  for (int mask = 1; mask < n; mask <<= 1) {
    if (v & mask) {
      RequestPtr toParent = links.isend(modRank(v - mask + root, n), makeTag(0, 0, 0), acc, bytes);
      links.wait(toParent);
      return;
    }
    if (v + mask >= n) continue;
    RequestPtr fromChild = links.irecv(modRank(v + mask + root, n), makeTag(0, 0, 0), incoming, bytes);
    links.wait(fromChild);
    reduce(acc, acc, incoming, count, type, op);
  }
}

// n a power of two: round k swaps the 2^k blocks this rank holds with the
// partner whose rank differs in bit k, so every rank sends n - 1 blocks in
// log2 n messages.
void allGatherDoubling(Links& links, const void* in, void* outv, size_t sendBytes) {
  const int n = links.size(), r = links.rank();
  auto* out = static_cast<uint8_t*>(outv);
  if (out + size_t(r) * sendBytes != in && sendBytes) moveBytes(out + size_t(r) * sendBytes, in, sendBytes);
  for (int mask = 1, step = 0; mask < n; mask <<= 1, ++step) {
    const int partner = r ^ mask;
    const size_t mine = size_t(r & ~(mask - 1)) * sendBytes, theirs = size_t(partner & ~(mask - 1)) * sendBytes;
    links.exchange(partner, makeTag(0, step, 0), out + mine, size_t(mask) * sendBytes, out + theirs,
                   size_t(mask) * sendBytes);
  }
}

}  // namespace eccl::coll
