// Every collective algorithm, written against Links only. Counts are in
// elements of `type`; reductions here never see float16/bfloat16 (the core
// widens those to float32 first, so partial sums are rounded only once).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "coll/links.h"
#include "eccl.h"

namespace eccl::coll {

// Links::scratch slots: the ring's receive halves, and whole-vector
// accumulators (reduce-scatter).
constexpr int kRingScratchSlot = 0;
constexpr int kAccumulatorScratchSlot = 1;

// Block b of a vector split for a ring covers [offsets[b], offsets[b+1]).
struct Blocks {
  std::vector<size_t> offsets;
  size_t size(int b) const { return offsets[b + 1] - offsets[b]; }
  size_t maxSize() const;
  static Blocks even(size_t count, int nblocks);    // near-equal split
  static Blocks uniform(size_t blockCount, int nblocks);
};

// Ring reduce-scatter: rank r ends with block r of acc fully reduced
// (acc[b] = in[b] op partials), segment by segment so the reduction of one
// segment overlaps the receipt of the next. `ownSegmentDone(k)`, when
// given and n > 1, runs as soon as segment k of block r is final, so a
// following all-gather can send it while later segments are still being
// reduced (at n = 1 there is nobody to send to).
void ringReduceScatter(Links& links, const void* in, void* acc, const Blocks& blocks,
                       ecclDataType_t type, ecclRedOp_t op, uint32_t phase,
                       const std::function<void(size_t segment)>& ownSegmentDone = {});
// Ring all-gather: rank r starts with block r of buf; ends with all blocks.
void ringAllGather(Links& links, void* buf, const Blocks& blocks, size_t elemSize, uint32_t phase);

// The all-gather in parts, for callers that produce rank r's block segment
// by segment: construction posts every receive, sendOwn(k) sends segment k
// of block r once it is final, finish() forwards the rest and waits.
class RingAllGather {
 public:
  RingAllGather(Links& links, void* buf, const Blocks& blocks, size_t elemSize, uint32_t phase);
  size_t ownSegments() const { return segments(links_.rank()); }
  void sendOwn(size_t segment);
  void finish();

 private:
  size_t segments(int block) const { return (blocks_.size(block) + seg_ - 1) / seg_; }
  size_t segmentLength(int block, size_t k) const { return std::min(seg_, blocks_.size(block) - k * seg_); }
  uint8_t* at(int block, size_t k) const { return buf_ + (blocks_.offsets[block] + k * seg_) * elemSize_; }
  int receivedAt(int step) const { return modRank(links_.rank() - step - 1, links_.size()); }

  Links& links_;
  uint8_t* const buf_;
  const Blocks& blocks_;
  const size_t elemSize_;
  const uint32_t phase_;
  const size_t seg_;
  const int next_, prev_;
  std::vector<std::vector<RequestPtr>> recvs_;
  std::vector<RequestPtr> sends_;
};

void allreduceRing(Links& links, const void* in, void* out, size_t count, ecclDataType_t type,
                   ecclRedOp_t op);
// Same host, every peer readable (Links::readsEveryPeer, coll/direct.h):
// the peers' buffers are read where they lie, the reductions piece by
// piece through a cache-sized buffer, in rank order. Small messages hold
// the peers in the op. Where some rank may not read every peer, every rank
// returns false having moved nothing (the caller runs another algorithm).
bool allreduceDirect(Links& links, const void* in, void* out, size_t count, ecclDataType_t type, ecclRedOp_t op);
bool reduceScatterDirect(Links& links, const void* in, void* out, size_t recvCount, ecclDataType_t type,
                         ecclRedOp_t op);
bool allGatherDirect(Links& links, const void* in, void* out, size_t bytes);
bool broadcastDirect(Links& links, const void* in, void* out, size_t bytes, int root);
// Half the tree's hops, but log2(n) partners per rank: not among
// latencyPeers, so they connect on first use (ECCL_ALLREDUCE_SMALL_ALGO).
void allreduceRecursiveDoubling(Links& links, const void* in, void* out, size_t count,
                                ecclDataType_t type, ecclRedOp_t op);
// Reduce-scatter by recursive halving, all-gather by recursive doubling,
// over recursive doubling's partners: for vectors past a latency message.
void allreduceHalvingDoubling(Links& links, const void* in, void* out, size_t count,
                              ecclDataType_t type, ecclRedOp_t op);
// The small-vector default: reduce up a binary tree, broadcast down;
// 2 log2(n) hops, and each rank talks to at most three others.
void allreduceTree(Links& links, const void* in, void* out, size_t count, ecclDataType_t type,
                   ecclRedOp_t op);
void reduceScatterRing(Links& links, const void* in, void* out, size_t recvCount,
                       ecclDataType_t type, ecclRedOp_t op);
void allGatherRing(Links& links, const void* in, void* out, size_t sendBytes);
// Latency versions for small messages, ceil(log2 n) rounds (binomial.cc);
// their partners are not ring or tree neighbours, so the communicator picks
// them only where a view change connects every pair anyway
// (everyPairIsALatencyPeer). allGatherDoubling needs n a power of two.
void broadcastBinomial(Links& links, const void* in, void* out, size_t bytes, int root);
void reduceBinomial(Links& links, const void* in, void* out, size_t count, ecclDataType_t type, ecclRedOp_t op,
                    int root);
void allGatherDoubling(Links& links, const void* in, void* out, size_t sendBytes);
void broadcastChain(Links& links, const void* in, void* out, size_t bytes, int root);
void reduceChain(Links& links, const void* in, void* out, size_t count, ecclDataType_t type,
                 ecclRedOp_t op, int root);
// Byte counts and displacements, one per rank.
void allToAllvPairwise(Links& links, const void* in, const size_t* sendBytes, const size_t* sendOffsets,
                       void* out, const size_t* recvBytes, const size_t* recvOffsets);
void barrierTree(Links& links);

// Heap-numbered binary tree: rank r's parent is (r-1)/2, its children
// 2r+1 and 2r+2 where they exist; rank 0 is the root.
struct BinaryTree {
  int parent = -1;
  int children[2] = {-1, -1};
  int childCount = 0;
};
BinaryTree binaryTree(int r, int n);
constexpr size_t kTreeSegmentBytes = 64 << 10;

// The ranks that rank r exchanges with in the ring, chain and tree
// algorithms of an n-rank view: ring neighbours, tree parent and children,
// at most five whatever n is. A view change connects exactly these
// (recursive doubling, all-to-all and send/recv pairs open lazily), so
// replacing one rank opens and closes O(1) connections.
std::vector<int> latencyPeers(int r, int n);
// Recursive doubling's ranks at n: p is the largest power of two <= n; of
// the first 2 * extra ranks, each even one folds its data into its odd
// neighbour and waits; the rest take virtual ranks 0..p-1 and exchange.
struct DoublingLayout {
  explicit DoublingLayout(int n) {
    while (p * 2 <= n) p *= 2;
    extra = n - p;
  }
  int p = 1, extra = 0;
  bool pairedBelowExtra(int r) const { return r < 2 * extra; }
  bool folded(int r) const { return pairedBelowExtra(r) && r % 2 == 0; }
  int virtualRank(int r) const { return pairedBelowExtra(r) ? r / 2 : r - extra; }
  int realRank(int v) const { return v < extra ? 2 * v + 1 : v + extra; }
};
// A non-power-of-two rank count first folds each extra rank into its
// neighbour above. Returns false on a folded rank, which already holds the
// result its neighbour answered with under answerTag; elsewhere `out` holds
// the pair's reduction and the caller runs over layout.p virtual ranks.
bool foldExtraRank(Links& links, const DoublingLayout& layout, uint8_t* out, uint8_t* tmp, size_t count,
                   ecclDataType_t type, ecclRedOp_t op, uint32_t answerTag);
// The neighbour's half of that: sends the folded rank the result.
void answerFoldedRank(Links& links, const DoublingLayout& layout, const uint8_t* out, size_t bytes,
                      uint32_t answerTag);
// The ranks allreduceRecursiveDoubling (and allreduceHalvingDoubling) has
// rank r of n exchange with.
std::vector<int> recursiveDoublingPartners(int r, int n);
// Whether recursive doubling at n ranks uses only latencyPeers, so it
// opens nothing a view change did not (true for n <= 4; checked up to 16
// ranks, false above without looking).
bool doublingNeedsOnlyLatencyPeers(int n);
// Whether latencyPeers of every rank of n is every other rank (n <= 4).
bool everyPairIsALatencyPeer(int n);

}  // namespace eccl::coll
