#include "coll/algorithms.h"
#include "coll/direct.h"
#include "coll/reduce.h"
#include "common/copy.h"

namespace eccl::coll {

// Rank r reduces block r from every input, then reads every other block
// from its reducer's output: each byte of a peer's data crosses memory
// once, where the ring copies it into the peer's scratch and reads it back.
// Every block is reduced at one rank in rank order ((x0 op x1) op x2 ...),
// so every rank ends with the same bits. In place (in == out) is safe:
// rank r writes only block r while the others read theirs, and reads
// block j into its output only after j said it is reduced, which j says
// after it read block j everywhere.
bool allreduceDirect(Links& links, const void* in, void* outv, size_t count, ecclDataType_t type, ecclRedOp_t op) {
  const int n = links.size(), r = links.rank();
  const size_t elem = typeSize(type);
  auto* out = static_cast<uint8_t*>(outv);
  if (n == 1) {
    if (out != in && count) copyBytes(out, in, count * elem);
    return true;
  }
  PeerBuffers peers(links, in, out);
  if (!peers.agreed()) return false;
  const Blocks blocks = Blocks::even(count, n);
  const size_t offset = blocks.offsets[r] * elem;
  reduceFromPeers(links, peers, in, offset, out + offset, blocks.size(r), type, op);
  // Each block is read as soon as its reducer says it is done, not once
  // all are: with more ranks than cores the reducers finish far apart.
  peers.eachReached(2, [&](int peer) {
    const size_t at = blocks.offsets[peer] * elem;
    peers.readOut(peer, at, out + at, blocks.size(peer) * elem);
  });
  peers.everyoneReached(3);  // nobody reads this rank's output any more
  return true;
}

// Rank r reduces its block of every input straight into its output.
// In place (out == in + r * block) is safe: rank r writes only its own
// block of its input, which nobody else reads.
bool reduceScatterDirect(Links& links, const void* in, void* out, size_t recvCount, ecclDataType_t type,
                         ecclRedOp_t op) {
  const int r = links.rank();
  PeerBuffers peers(links, in, out);
  if (!peers.agreed()) return false;
  reduceFromPeers(links, peers, in, r * recvCount * typeSize(type), out, recvCount, type, op);
  peers.everyoneReached(2);  // nobody reads this rank's input any more
  return true;
}

// Every rank reads every peer's input into its block of the output. In
// place (in == out + r * bytes) is safe: the peers read only block r,
// which rank r never writes.
bool allGatherDirect(Links& links, const void* in, void* outv, size_t bytes) {
  const int n = links.size(), r = links.rank();
  auto* out = static_cast<uint8_t*>(outv);
  PeerBuffers peers(links, in, out);
  if (!peers.agreed()) return false;
  if (out + r * bytes != in && bytes) copyBytes(out + r * bytes, in, bytes);
  for (int k = 1; k < n; ++k) {
    const int peer = (r + k) % n;
    peers.readIn(peer, 0, out + peer * bytes, bytes);
  }
  peers.everyoneReached(2);
  return true;
}

// Every rank reads the root's input.
bool broadcastDirect(Links& links, const void* in, void* outv, size_t bytes, int root) {
  const int r = links.rank();
  auto* out = static_cast<uint8_t*>(outv);
  PeerBuffers peers(links, in, out);
  if (!peers.agreed()) return false;
  if (r == root) {
    if (out != in && bytes) moveBytes(out, in, bytes);
  } else {
    peers.readIn(root, 0, out, bytes);
  }
  peers.everyoneReached(2);
  return true;
}

}  // namespace eccl::coll
