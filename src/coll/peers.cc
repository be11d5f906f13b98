#include <algorithm>

#include "coll/algorithms.h"

namespace eccl::coll {

// Mirrors the partner choices of the ring and chain algorithms (r +- 1)
// and of allreduceTree and barrierTree (parent and children).
std::vector<int> latencyPeers(int r, int n) {
  std::vector<int> peers;
  if (n <= 1) return peers;
  auto add = [&](int p) {
    if (p >= 0 && p != r) peers.push_back(p);
  };
  add(modRank(r + 1, n));
  add(modRank(r - 1, n));
  BinaryTree tree = binaryTree(r, n);
  add(tree.parent);
  for (int c = 0; c < tree.childCount; ++c) add(tree.children[c]);
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  return peers;
}

}  // namespace eccl::coll
