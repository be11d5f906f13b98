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

// Mirrors allreduceRecursiveDoubling's fold and exchanges (peers_test
// checks the two against each other).
std::vector<int> recursiveDoublingPartners(int r, int n) {
  std::vector<int> partners;
  if (n <= 1) return partners;
  const DoublingLayout layout(n);
  if (layout.folded(r)) return {r + 1};
  if (layout.pairedBelowExtra(r)) partners.push_back(r - 1);
  for (int mask = 1; mask < layout.p; mask <<= 1)
    partners.push_back(layout.realRank(layout.virtualRank(r) ^ mask));
  std::sort(partners.begin(), partners.end());
  return partners;
}

bool everyPairIsALatencyPeer(int n) {
  if (n > 16) return false;  // at most five peers each
  for (int r = 0; r < n; ++r)
    if (latencyPeers(r, n).size() != size_t(n - 1)) return false;
  return true;
}

bool doublingNeedsOnlyLatencyPeers(int n) {
  if (n > 16) return false;
  for (int r = 0; r < n; ++r) {
    const std::vector<int> connected = latencyPeers(r, n);
    for (int p : recursiveDoublingPartners(r, n))
      if (!std::binary_search(connected.begin(), connected.end(), p)) return false;
  }
  return true;
}

}  // namespace eccl::coll
