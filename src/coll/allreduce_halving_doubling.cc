#include "coll/algorithms.h"
#include "coll/reduce.h"
#include "common/copy.h"

namespace eccl::coll {

namespace {

// Rank r's part of the vector while it halves and doubles: blocks [lo, hi)
// of p near-equal blocks, one per virtual rank.
class BlockRange {
 public:
  BlockRange(uint8_t* base, size_t elemSize, int p, size_t count)
      : base_(base), elem_(elemSize), blocks_(Blocks::even(count, p)), hi_(p) {}
  uint8_t* at(int block) const { return base_ + blocks_.offsets[block] * elem_; }
  size_t elems(int lo, int hi) const { return blocks_.offsets[hi] - blocks_.offsets[lo]; }
  size_t bytes(int lo, int hi) const { return elems(lo, hi) * elem_; }
  int lo() const { return lo_; }
  int hi() const { return hi_; }
  void set(int lo, int hi) { lo_ = lo, hi_ = hi; }

 private:
  uint8_t* const base_;
  const size_t elem_;
  const Blocks blocks_;
  int lo_ = 0, hi_;
};

}  // namespace

// Rabenseifner's allreduce: a reduce-scatter by recursive halving, then an
// all-gather by recursive doubling, over recursive doubling's partners (so
// the same ranks connect). Each rank sends 2 (p-1)/p of the vector where
// the tree sends the whole of it to its parent and to each child, and
// reduces (p-1)/p of it where recursive doubling reduces all of it log2 p
// times. Each block is reduced at one rank only, (lower virtual rank's
// data) op (higher's), so every rank ends with the same bits.
void allreduceHalvingDoubling(Links& links, const void* in, void* outv, size_t count, ecclDataType_t type,
                              ecclRedOp_t op) {
  const int n = links.size(), r = links.rank();
  const size_t elem = typeSize(type), bytes = count * elem;
  auto* out = static_cast<uint8_t*>(outv);
  const DoublingLayout layout(n);
  // Out of place, the first halving sends from the input and reduces into
  // the output: no copy outside the fold (the output's given half is only
  // ever written by the all-gather).
  const uint8_t* firstFrom = static_cast<const uint8_t*>(in);
  if (out != in && bytes && (n == 1 || layout.pairedBelowExtra(r))) {
    copyBytes(out, in, bytes);
    firstFrom = out;
  }
  if (n == 1) return;
  uint8_t* tmp = links.scratch(kRingScratchSlot, bytes);  // the ring is not running
  if (!foldExtraRank(links, layout, out, tmp, count, type, op, makeTag(3, 0, 0))) return;
  const int v = layout.virtualRank(r);
  BlockRange range(out, elem, layout.p, count);
  uint32_t step = 0;
  for (int mask = layout.p / 2; mask >= 1; mask >>= 1, ++step) {
    const int partnerVirtual = v ^ mask, partner = layout.realRank(partnerVirtual);
    const int mid = range.lo() + (range.hi() - range.lo()) / 2;
    const bool keepLower = (v & mask) == 0;
    const int keepLo = keepLower ? range.lo() : mid, keepHi = keepLower ? mid : range.hi();
    const int giveLo = keepLower ? mid : range.lo(), giveHi = keepLower ? range.hi() : mid;
    const uint8_t* from = step == 0 ? firstFrom : out;
    links.exchange(partner, makeTag(1, step, 0), from + (range.at(giveLo) - out), range.bytes(giveLo, giveHi), tmp,
                   range.bytes(keepLo, keepHi));
    uint8_t* kept = range.at(keepLo);
    const uint8_t* mine = from + (kept - out);
    if (partnerVirtual < v)
      reduce(kept, tmp, mine, range.elems(keepLo, keepHi), type, op);
    else
      reduce(kept, mine, tmp, range.elems(keepLo, keepHi), type, op);
    range.set(keepLo, keepHi);
  }
  // Now range is block v alone, fully reduced; the partner at each mask
  // holds the adjacent range of the same width.
  for (int mask = 1; mask < layout.p; mask <<= 1, ++step) {
    const int partner = layout.realRank(v ^ mask);
    const int width = range.hi() - range.lo();
    const int otherLo = (v & mask) ? range.lo() - width : range.hi(), otherHi = otherLo + width;
    links.exchange(partner, makeTag(2, step, 0), range.at(range.lo()), range.bytes(range.lo(), range.hi()),
                   range.at(otherLo), range.bytes(otherLo, otherHi));
    range.set(std::min(range.lo(), otherLo), std::max(range.hi(), otherHi));
  }
  answerFoldedRank(links, layout, out, bytes, makeTag(3, 0, 0));
}

}  // namespace eccl::coll
