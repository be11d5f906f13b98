#include "coll/direct.h"

#include <algorithm>

#include "coll/algorithms.h"
#include "coll/reduce.h"
#include "common/copy.h"
#include "common/error.h"

namespace eccl::coll {

namespace {

// Pieces small enough that three of them stay in a core's L2 while the
// peers' data streams through (128 KiB to 512 KiB did alike here; 64 KiB
// and 1 MiB were slower).
constexpr size_t kPieceBytes = 256 << 10;

}  // namespace

PeerBuffers::PeerBuffers(Links& links, const void* in, const void* out) : links_(links), buffers_(links.size()) {
  const int n = links.size(), r = links.rank();
  buffers_[r] = {reinterpret_cast<uint64_t>(in), reinterpret_cast<uint64_t>(out), links.readsEveryPeer()};
  requests_.reserve(2 * n);
  for (int k = 1; k < n; ++k)
    requests_.push_back(links.irecv((r + k) % n, makeTag(1, 0, 0), &buffers_[(r + k) % n], sizeof(Buffers)));
  for (int k = 1; k < n; ++k)
    requests_.push_back(links.isend((r + k) % n, makeTag(1, 0, 0), &buffers_[r], sizeof(Buffers)));
  links.waitAll(requests_);
  for (const Buffers& b : buffers_) agreed_ = agreed_ && b.readsEveryPeer;
}

void PeerBuffers::everyoneReached(uint32_t phase) {
  const int n = links_.size(), r = links_.rank();
  for (int k = 1; k < n; ++k) requests_.push_back(links_.irecv((r + k) % n, makeTag(phase, 0, 0), nullptr, 0));
  for (int k = 1; k < n; ++k) requests_.push_back(links_.isend((r + k) % n, makeTag(phase, 0, 0), nullptr, 0));
  links_.waitAll(requests_);
}

void PeerBuffers::eachReached(uint32_t phase, FunctionRef<void(int peer)> then) {
  const int n = links_.size(), r = links_.rank();
  std::vector<RequestPtr> arrivals;
  arrivals.reserve(n - 1);
  for (int k = 1; k < n; ++k) arrivals.push_back(links_.irecv((r + k) % n, makeTag(phase, 0, 0), nullptr, 0));
  for (int k = 1; k < n; ++k) requests_.push_back(links_.isend((r + k) % n, makeTag(phase, 0, 0), nullptr, 0));
  // In rank order from the next: each peer reads the blocks in a different
  // order, so they do not all read the same reducer at once.
  for (int k = 1; k < n; ++k) {
    links_.wait(arrivals[k - 1]);
    then((r + k) % n);
  }
  links_.waitAll(requests_);
}

void PeerBuffers::read(int rank, uint64_t address, void* into, size_t bytes) {
  if (bytes) links_.readPeer(rank, address, into, bytes);
}

void reduceFromPeers(Links& links, PeerBuffers& peers, const void* ownIn, size_t offset, void* intov, size_t count,
                     ecclDataType_t type, ecclRedOp_t op) {
  const int n = links.size(), r = links.rank();
  const size_t elem = typeSize(type);
  const size_t pieceElems = std::max<size_t>(1, kPieceBytes / elem);
  uint8_t* scratch = links.scratch(kRingScratchSlot, 3 * pieceElems * elem);
  uint8_t* staged[2] = {scratch, scratch + pieceElems * elem};
  uint8_t* partial = scratch + 2 * pieceElems * elem;
  const auto* own = static_cast<const uint8_t*>(ownIn) + offset;
  auto* into = static_cast<uint8_t*>(intov);
  for (size_t done = 0; done < count; done += pieceElems) {
    const size_t elems = std::min(pieceElems, count - done), at = done * elem;
    auto source = [&](int rank, int stage) -> const uint8_t* {
      if (rank == r) return own + at;
      peers.readIn(rank, offset + at, staged[stage], elems * elem);
      return staged[stage];
    };
    const uint8_t* sum = source(0, 0);
    for (int rank = 1; rank < n; ++rank) {
      uint8_t* piece = rank == n - 1 ? into + at : partial;
      reduce(piece, sum, source(rank, 1), elems, type, op);
      sum = piece;
    }
    if (n == 1 && into + at != sum) copyBytes(into + at, sum, elems * elem);
  }
}

}  // namespace eccl::coll
