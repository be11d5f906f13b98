#include <vector>

#include "coll/algorithms.h"

namespace eccl::coll {

// log2(n) rounds: in round k each rank signals r+2^k and waits for r-2^k.
void barrierDissemination(Links& links) {
  const int n = links.size(), r = links.rank();
  uint8_t token = 0, got = 0;
  std::vector<RequestPtr> reqs;
  for (int dist = 1, round = 0; dist < n; dist <<= 1, ++round) {
    reqs.push_back(links.irecv(modRank(r - dist, n), makeTag(0, round, 0), &got, 1));
    reqs.push_back(links.isend(modRank(r + dist, n), makeTag(0, round, 0), &token, 1));
    links.waitAll(reqs);
  }
}

}  // namespace eccl::coll
