#include <algorithm>

#include "coll/algorithms.h"
#include "coll/reduce.h"
#include "common/copy.h"

namespace eccl::coll {
namespace {

// Elements per pipeline segment: the configured size, grown if a block
// would need more segments than a tag can number.
size_t segmentElems(const Links& links, size_t maxBlock, size_t elemSize) {
  size_t seg = std::max<size_t>(1, links.segmentBytes() / elemSize);
  return std::max(seg, (maxBlock + kMaxSegments - 1) / kMaxSegments);
}

}  // namespace

void ringReduceScatter(Links& links, const void* inv, void* accv, const Blocks& blocks, ecclDataType_t type,
                       ecclRedOp_t op, uint32_t phase, const std::function<void(size_t)>& ownSegmentDone) {
  const int n = links.size(), r = links.rank();
  const size_t es = typeSize(type);
  auto* in = static_cast<const uint8_t*>(inv);
  auto* acc = static_cast<uint8_t*>(accv);
  if (n == 1) {
    if (acc != in) copyBytes(acc + blocks.offsets[0] * es, in + blocks.offsets[0] * es, blocks.size(0) * es);
    return;
  }
  const int next = modRank(r + 1, n), prev = modRank(r - 1, n);
  const size_t seg = segmentElems(links, blocks.maxSize(), es);
  // At step s rank r sends block r-s-1 and receives block r-s-2, so after
  // n-1 steps it holds block r.
  auto sentAt = [&](int s) { return modRank(r - s - 1, n); };
  auto receivedAt = [&](int s) { return modRank(r - s - 2, n); };
  auto segments = [&](int b) { return (blocks.size(b) + seg - 1) / seg; };
  auto segLen = [&](int b, size_t k) { return std::min(seg, blocks.size(b) - k * seg); };

  uint8_t* const halves = links.scratch(kRingScratchSlot, 2 * blocks.maxSize() * es);
  uint8_t* const scratch[2] = {halves, halves + blocks.maxSize() * es};
  std::vector<std::vector<RequestPtr>> recvs(n - 1);
  std::vector<RequestPtr> sends;
  auto postReceives = [&](int s) {
    int b = receivedAt(s);
    for (size_t k = 0; k < segments(b); ++k)
      recvs[s].push_back(links.irecv(prev, makeTag(phase, s, k), scratch[s % 2] + k * seg * es,
                                     segLen(b, k) * es));
  };
  postReceives(0);
  if (n > 2) postReceives(1);
  for (size_t k = 0, b = sentAt(0); k < segments(b); ++k)
    sends.push_back(links.isend(next, makeTag(phase, 0, k), in + (blocks.offsets[b] + k * seg) * es,
                                segLen(b, k) * es));
  for (int s = 0; s < n - 1; ++s) {
    // scratch[(s+1)%2] was drained in step s-1, so step s+1 may land there.
    if (s >= 1 && s + 1 < n - 1) postReceives(s + 1);
    int b = receivedAt(s);
    for (size_t k = 0; k < segments(b); ++k) {
      links.wait(recvs[s][k]);
      size_t off = (blocks.offsets[b] + k * seg) * es;
      reduce(acc + off, in + off, scratch[s % 2] + k * seg * es, segLen(b, k), type, op);
      // The block just reduced is the one sent at the next step.
      if (s + 1 < n - 1)
        sends.push_back(links.isend(next, makeTag(phase, s + 1, k), acc + off, segLen(b, k) * es));
      else if (ownSegmentDone)
        ownSegmentDone(k);
    }
    recvs[s].clear();
  }
  links.waitAll(sends);
}

RingAllGather::RingAllGather(Links& links, void* buf, const Blocks& blocks, size_t elemSize, uint32_t phase)
    : links_(links),
      buf_(static_cast<uint8_t*>(buf)),
      blocks_(blocks),
      elemSize_(elemSize),
      phase_(phase),
      seg_(segmentElems(links, blocks.maxSize(), elemSize)),
      next_(modRank(links.rank() + 1, links.size())),
      prev_(modRank(links.rank() - 1, links.size())),
      recvs_(std::max(0, links.size() - 1)) {
  // Every block has its own place in buf, so all receives go up front. In
  // place after a reduce-scatter this is safe too: a block arrives here only
  // after it went round the ring, which needed this rank's send of it to
  // have been received.
  for (int s = 0; s + 1 < links.size(); ++s)
    for (size_t k = 0, b = receivedAt(s); k < segments(b); ++k)
      recvs_[s].push_back(links.irecv(prev_, makeTag(phase, s, k), at(b, k), segmentLength(b, k) * elemSize_));
}

void RingAllGather::sendOwn(size_t k) {
  if (links_.size() == 1) return;
  const int b = links_.rank();
  sends_.push_back(links_.isend(next_, makeTag(phase_, 0, k), at(b, k), segmentLength(b, k) * elemSize_));
}

void RingAllGather::finish() {
  const int n = links_.size();
  for (int s = 0; s + 1 < n; ++s) {
    int b = receivedAt(s);
    for (size_t k = 0; k < segments(b); ++k) {
      links_.wait(recvs_[s][k]);
      if (s + 2 < n)
        sends_.push_back(links_.isend(next_, makeTag(phase_, s + 1, k), at(b, k), segmentLength(b, k) * elemSize_));
    }
  }
  links_.waitAll(sends_);
}

void ringAllGather(Links& links, void* buf, const Blocks& blocks, size_t es, uint32_t phase) {
  RingAllGather gather(links, buf, blocks, es, phase);
  for (size_t k = 0; k < gather.ownSegments(); ++k) gather.sendOwn(k);
  gather.finish();
}

}  // namespace eccl::coll
