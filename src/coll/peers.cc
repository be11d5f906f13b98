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
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int extra = n - p;
  if (r < 2 * extra && r % 2 == 0) return {r + 1};
  int virtualRank = r < 2 * extra ? r / 2 : r - extra;
  if (r < 2 * extra) partners.push_back(r - 1);
  for (int mask = 1; mask < p; mask <<= 1) {
    const int v = virtualRank ^ mask;
    partners.push_back(v < extra ? 2 * v + 1 : v + extra);
  }
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
