#include <algorithm>

#include "coll/algorithms.h"

namespace eccl::coll {

// Mirrors the partner choices of allreduceRecursiveDoubling (fold of the
// extra ranks, then XOR partners among the power-of-two set),
// barrierDissemination (r +- 2^k) and the ring and chain algorithms (r +- 1).
std::vector<int> latencyPeers(int r, int n) {
  std::vector<int> peers;
  if (n <= 1) return peers;
  auto add = [&](int p) {
    p = ((p % n) + n) % n;
    if (p != r) peers.push_back(p);
  };
  add(r + 1);
  add(r - 1);
  for (int dist = 1; dist < n; dist <<= 1) add(r + dist), add(r - dist);
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int extra = n - p;
  auto realRank = [&](int v) { return v < extra ? 2 * v + 1 : v + extra; };
  if (r < 2 * extra && r % 2 == 0) {
    add(r + 1);
  } else {
    int virtualRank = r < 2 * extra ? r / 2 : r - extra;
    if (r < 2 * extra) add(r - 1);
    for (int mask = 1; mask < p; mask <<= 1) add(realRank(virtualRank ^ mask));
  }
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  return peers;
}

}  // namespace eccl::coll
