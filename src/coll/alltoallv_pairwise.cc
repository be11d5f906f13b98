#include <vector>

#include "coll/algorithms.h"
#include "common/copy.h"

namespace eccl::coll {

// Pairwise exchange: at step s rank r sends to r+s and receives from r-s.
// All receives are posted first so no data is staged; sends go out in step
// order, which spreads the load evenly over the peers.
void allToAllvPairwise(Links& links, const void* inv, const size_t* sendBytes, const size_t* sendOffsets,
                       void* outv, const size_t* recvBytes, const size_t* recvOffsets) {
  const int n = links.size(), r = links.rank();
  auto* in = static_cast<const uint8_t*>(inv);
  auto* out = static_cast<uint8_t*>(outv);
  std::vector<RequestPtr> reqs;
  for (int s = 1; s < n; ++s) {
    int from = modRank(r - s, n);
    reqs.push_back(links.irecv(from, makeTag(0, 0, 0), out + recvOffsets[from], recvBytes[from]));
  }
  for (int s = 1; s < n; ++s) {
    int to = modRank(r + s, n);
    reqs.push_back(links.isend(to, makeTag(0, 0, 0), in + sendOffsets[to], sendBytes[to]));
  }
  if (sendBytes[r] && out + recvOffsets[r] != in + sendOffsets[r])
    moveBytes(out + recvOffsets[r], in + sendOffsets[r], sendBytes[r]);
  links.waitAll(reqs);
}

}  // namespace eccl::coll
