// The connection set a view change opens (coll::latencyPeers) must cover
// every peer the ring, chain and tree algorithms actually use, be
// symmetric (both ends agree), and stay bounded whatever n is: that bound
// is what a replacement opens and closes. The algorithms run here against
// links that record peers and complete at once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "coll/algorithms.h"

namespace eccl::coll {
namespace {

class RecordingLinks final : public Links {
 public:
  RecordingLinks(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  RequestPtr isend(int peer, uint32_t, const void*, size_t) override { return record(peer); }
  RequestPtr irecv(int peer, uint32_t, void*, size_t) override { return record(peer); }
  void wait(const RequestPtr&) override {}
  size_t segmentBytes() const override { return 64; }
  uint8_t* scratch(int slot, size_t bytes) override {
    if (slot >= int(scratch_.size())) scratch_.resize(slot + 1);
    scratch_[slot].resize(bytes);
    return scratch_[slot].data();
  }
  std::vector<std::vector<uint8_t>> scratch_;
  std::set<int> peers;

 private:
  RequestPtr record(int peer) {
    peers.insert(peer);
    auto r = std::make_shared<transport::Request>();
    r->state = transport::Request::kDone;
    return r;
  }
  int rank_, size_;
};

TEST(LatencyPeers, CoverEveryPeerTheSmallAndRingAlgorithmsUse) {
  for (int n = 1; n <= 40; ++n) {
    for (int r = 0; r < n; ++r) {
      RecordingLinks links(r, n);
      std::vector<float> in(n * 4, 1.0f), out(n * 4);
      allreduceTree(links, in.data(), out.data(), 4, ecclFloat32, ecclSum);
      barrierTree(links);
      allreduceRing(links, in.data(), out.data(), in.size(), ecclFloat32, ecclSum);
      broadcastChain(links, in.data(), out.data(), 16, 0);
      auto peers = latencyPeers(r, n);
      for (int p : links.peers)
        EXPECT_TRUE(std::count(peers.begin(), peers.end(), p)) << "rank " << r << " of " << n << " uses " << p;
      EXPECT_LE(peers.size(), 5u) << "n=" << n;
      for (int p : peers) {
        auto back = latencyPeers(p, n);
        EXPECT_TRUE(std::count(back.begin(), back.end(), r)) << r << " -> " << p << " of " << n << " is one-sided";
        EXPECT_NE(p, r);
      }
    }
  }
}

// auto picks recursive doubling for small allreduces only where it opens
// no connection outside latencyPeers, so a replacement still touches only
// those; the mirror of its partners must match what it really uses.
TEST(LatencyPeers, RecursiveDoublingPartnersMirrorTheAlgorithm) {
  std::vector<int> free;
  for (int n = 1; n <= 40; ++n) {
    for (int r = 0; r < n; ++r) {
      RecordingLinks links(r, n), halving(r, n);
      std::vector<float> in(4, 1.0f), out(4);
      allreduceRecursiveDoubling(links, in.data(), out.data(), 4, ecclFloat32, ecclSum);
      const std::vector<int> used(links.peers.begin(), links.peers.end());
      EXPECT_EQ(used, recursiveDoublingPartners(r, n)) << "rank " << r << " of " << n;
      allreduceHalvingDoubling(halving, in.data(), out.data(), 4, ecclFloat32, ecclSum);
      const std::vector<int> halvingUsed(halving.peers.begin(), halving.peers.end());
      EXPECT_EQ(halvingUsed, recursiveDoublingPartners(r, n)) << "halving: rank " << r << " of " << n;
    }
    if (doublingNeedsOnlyLatencyPeers(n)) free.push_back(n);
  }
  for (int n = 1; n <= 4; ++n) EXPECT_TRUE(std::count(free.begin(), free.end(), n)) << n;
  for (int n : free) {
    for (int r = 0; r < n; ++r) {
      auto peers = latencyPeers(r, n);
      for (int p : recursiveDoublingPartners(r, n))
        EXPECT_TRUE(std::count(peers.begin(), peers.end(), p)) << "rank " << r << " of " << n << " needs " << p;
    }
  }
  EXPECT_FALSE(doublingNeedsOnlyLatencyPeers(64));
}

// The binomial broadcast and reduce and the doubling allgather have no
// mirror: the communicator takes them only where every pair is connected.
TEST(LatencyPeers, EveryPairIsConnectedUpToFourRanks) {
  for (int n = 1; n <= 40; ++n) EXPECT_EQ(everyPairIsALatencyPeer(n), n <= 4) << n;
}

// Replacing rank v touches exactly the ranks that list v: at most five
// connections at any size, the same at 8 ranks as at 4096.
TEST(LatencyPeers, ReplacingOneRankTouchesAtMostFiveOthersAtAnySize) {
  for (int n : {4, 8, 32, 1000, 4096}) {
    std::vector<size_t> listedBy(n, 0);
    for (int r = 0; r < n; ++r)
      for (int p : latencyPeers(r, n)) ++listedBy[p];
    size_t most = 0;
    for (int v = 0; v < n; ++v) {
      EXPECT_EQ(listedBy[v], latencyPeers(v, n).size()) << "rank " << v << " of " << n;
      most = std::max(most, listedBy[v]);
    }
    EXPECT_LE(most, 5u) << "n=" << n;
    EXPECT_EQ(most, n >= 8 ? 5u : 3u) << "n=" << n;
  }
}

}  // namespace
}  // namespace eccl::coll
