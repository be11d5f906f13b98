// The delta planner (elastic/delta.h): what one member closes, adds, keeps
// and connects when the view changes, checked on the changes eccl makes:
// replace one rank, shrink, grow, renumber, first view. The O(1) promise is
// that the connect set stays within the algorithm partners (at most five)
// at any size, and everything not named changes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "elastic/delta.h"

namespace eccl::elastic {
namespace {

std::vector<MemberId> members(int n, MemberId first = 100) {
  std::vector<MemberId> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::set<MemberId> asSet(const std::vector<MemberId>& v) { return {v.begin(), v.end()}; }

TEST(DeltaPlan, ReplacingOneRankClosesOnlyItAndAddsOnlyTheNewcomerAtAnySize) {
  for (int n : {2, 3, 4, 5, 8, 16, 64, 1024}) {
    std::vector<MemberId> before = members(n), after = before;
    const int replaced = n / 2;
    after[static_cast<size_t>(replaced)] = 9999;
    for (int r = 0; r < n; ++r) {
      if (r == replaced) continue;
      DeltaPlan p = planDelta(before, after, before[static_cast<size_t>(r)], r);
      EXPECT_EQ(p.close, std::vector<MemberId>{before[static_cast<size_t>(replaced)]}) << "n=" << n << " r=" << r;
      EXPECT_EQ(p.add, std::vector<MemberId>{9999}) << "n=" << n << " r=" << r;
      EXPECT_EQ(p.keep.size(), static_cast<size_t>(n - 2)) << "n=" << n;
      EXPECT_LE(p.connect.size(), 5u) << "n=" << n;
    }
    // The newcomer: nothing to close or keep; it connects only its partners.
    DeltaPlan joiner = planDelta({}, after, 9999, replaced);
    EXPECT_TRUE(joiner.close.empty() && joiner.keep.empty());
    EXPECT_EQ(joiner.add.size(), static_cast<size_t>(n - 1));
    EXPECT_LE(joiner.connect.size(), 5u);
  }
}

TEST(DeltaPlan, ConnectSetIsSymmetricSoBothEndsOpenTheSameLinks) {
  for (int n : {2, 3, 7, 8, 33}) {
    std::vector<MemberId> view = members(n);
    for (int a = 0; a < n; ++a) {
      DeltaPlan pa = planDelta(view, view, view[static_cast<size_t>(a)], a);
      for (MemberId peer : pa.connect) {
        int b = static_cast<int>(peer - 100);
        DeltaPlan pb = planDelta(view, view, peer, b);
        EXPECT_TRUE(asSet(pb.connect).count(view[static_cast<size_t>(a)])) << "n=" << n << " " << a << "->" << b;
      }
    }
  }
}

TEST(DeltaPlan, ShrinkClosesTheLeaversGrowAddsTheJoinersRenumberingChangesNoLink) {
  std::vector<MemberId> before = members(6);
  std::vector<MemberId> shrunk = {100, 101, 103, 105};
  DeltaPlan s = planDelta(before, shrunk, 103, 2);
  EXPECT_EQ(asSet(s.close), (std::set<MemberId>{102, 104}));
  EXPECT_TRUE(s.add.empty());
  EXPECT_EQ(asSet(s.keep), (std::set<MemberId>{100, 101, 105}));

  std::vector<MemberId> grown = {100, 101, 103, 105, 200, 201};
  DeltaPlan g = planDelta(shrunk, grown, 100, 0);
  EXPECT_TRUE(g.close.empty());
  EXPECT_EQ(g.add, (std::vector<MemberId>{200, 201}));

  std::vector<MemberId> renumbered = {105, 103, 101, 100};
  DeltaPlan r = planDelta(shrunk, renumbered, 101, 2);
  EXPECT_TRUE(r.close.empty() && r.add.empty());
  EXPECT_EQ(asSet(r.keep), (std::set<MemberId>{100, 103, 105}));
  for (MemberId m : r.connect) EXPECT_NE(m, 101u);
}

TEST(DeltaPlan, AMemberAloneHasNothingToDo) {
  DeltaPlan p = planDelta({7}, {7}, 7, 0);
  EXPECT_TRUE(p.close.empty() && p.add.empty() && p.keep.empty() && p.connect.empty());
}

}  // namespace
}  // namespace eccl::elastic
