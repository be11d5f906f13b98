// The connection set a view change opens (coll::latencyPeers) must cover
// every peer the ring, chain, recursive-doubling and dissemination
// algorithms actually use, be symmetric (both ends agree), and stay
// O(log n). The algorithms run here against links that record peers and
// complete at once.
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
      allreduceRecursiveDoubling(links, in.data(), out.data(), 4, ecclFloat32, ecclSum);
      barrierDissemination(links);
      allreduceRing(links, in.data(), out.data(), in.size(), ecclFloat32, ecclSum);
      broadcastChain(links, in.data(), out.data(), 16, 0);
      auto peers = latencyPeers(r, n);
      for (int p : links.peers)
        EXPECT_TRUE(std::count(peers.begin(), peers.end(), p)) << "rank " << r << " of " << n << " uses " << p;
      EXPECT_LE(peers.size(), 2 + 3 * std::ceil(std::log2(std::max(n, 2)))) << "n=" << n;
      for (int p : peers) {
        auto back = latencyPeers(p, n);
        EXPECT_TRUE(std::count(back.begin(), back.end(), r)) << r << " -> " << p << " of " << n << " is one-sided";
        EXPECT_NE(p, r);
      }
    }
  }
}

}  // namespace
}  // namespace eccl::coll
