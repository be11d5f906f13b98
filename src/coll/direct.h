// Same-host collectives that read the peers' buffers where they lie
// (Links::readPeer, transport/peer_memory.h): the rounds of small messages
// that make that safe, shared by allreduce, reduce-scatter, all-gather and
// broadcast (direct.cc, allreduce_direct.cc).
#pragma once

#include <cstdint>
#include <vector>

#include "coll/links.h"
#include "common/function_ref.h"
#include "eccl.h"

namespace eccl::coll {

// Round 1: every rank sends every peer where its input and output are and
// whether it may read every peer. Once it returns, every peer is inside
// the op and its buffers are readable until it hears done() from this
// rank. agreed() is the same at every rank (each saw every rank's word).
class PeerBuffers {
 public:
  PeerBuffers(Links& links, const void* in, const void* out);
  bool agreed() const { return agreed_; }
  uint64_t in(int rank) const { return buffers_[rank].in; }
  uint64_t out(int rank) const { return buffers_[rank].out; }
  // Reads `bytes` at `offset` into `rank`'s input (output) into `into`.
  void readIn(int rank, size_t offset, void* into, size_t bytes) { read(rank, in(rank) + offset, into, bytes); }
  void readOut(int rank, size_t offset, void* into, size_t bytes) { read(rank, out(rank) + offset, into, bytes); }
  // An empty message to and from every peer: every rank got past the same point.
  void everyoneReached(uint32_t phase);
  // The same, calling `then(peer)` once each peer's message is in, peers
  // taken in rank order from the next one.
  void eachReached(uint32_t phase, FunctionRef<void(int peer)> then);

 private:
  struct Buffers {
    uint64_t in, out;
    uint64_t readsEveryPeer;  // 0: that rank may not read some peer's memory
  };
  void read(int rank, uint64_t address, void* into, size_t bytes);

  Links& links_;
  std::vector<Buffers> buffers_;
  std::vector<RequestPtr> requests_;
  bool agreed_ = true;
};

// Reduces `count` elements at byte `offset` of every rank's input, in rank
// order, into `into` (this rank's memory; may be this rank's own input at
// `offset`), 256 KiB at a time through scratch slot kRingScratchSlot.
void reduceFromPeers(Links& links, PeerBuffers& peers, const void* ownIn, size_t offset, void* into, size_t count,
                     ecclDataType_t type, ecclRedOp_t op);

}  // namespace eccl::coll
