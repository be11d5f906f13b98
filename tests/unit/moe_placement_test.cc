// Replica allocation, the three placements, recovery probability (exact
// and Monte-Carlo agree), the migration plan and the phy2log import.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "kernels/moe_placement.h"

namespace eccl::moe {
namespace {

std::vector<double> zipf(int e, double s) {
  std::vector<double> load(e);
  for (int i = 0; i < e; ++i) load[i] = 1000.0 / std::pow(i + 1, s);
  return load;
}

void expectValid(const Placement& p, const std::vector<int>& replicas, int slots) {
  std::vector<int> count(replicas.size(), 0);
  for (auto& node : p) {
    EXPECT_LE(static_cast<int>(node.size()), slots);
    for (int e : node) count[e]++;
  }
  EXPECT_EQ(count, replicas);
}

TEST(MoeAllocation, FollowsTheFormulaAndFillsEverySlot) {
  EXPECT_EQ(allocateReplicas({1, 2, 3, 10}, 4, 4, 2), (std::vector<int>{2, 2, 2, 10}));
  EXPECT_EQ(allocateReplicas({5, 5, 5, 5}, 2, 2, 1), (std::vector<int>{1, 1, 1, 1}));
  for (int e : {8, 16}) {
    auto r = allocateReplicas(zipf(e, 1.2), 10, 6, 2);
    int total = 0;
    for (int x : r) {
      EXPECT_GE(x, 2);
      total += x;
    }
    EXPECT_EQ(total, 60);
    EXPECT_GE(r[0], r[e - 1]) << "the most loaded expert got fewer replicas than the least";
  }
  EXPECT_THROW(allocateReplicas(zipf(40, 1), 10, 6, 2), std::invalid_argument);  // 80 > 60
  EXPECT_THROW(allocateReplicas({1, -1}, 2, 2, 1), std::invalid_argument);
}

TEST(MoePlacement, EveryStrategyPlacesEveryReplicaWithinTheSlots) {
  for (int e : {8, 16}) {
    auto r = allocateReplicas(zipf(e, 1.2), 10, 6, 2);
    expectValid(placeMaxOverlap(r, 10, 6), r, 6);
    expectValid(placeSpread(r, 10, 6), r, 6);
    expectValid(placeCompact(r, 10, 6), r, 6);
  }
  EXPECT_THROW(placeSpread({30, 31}, 10, 6), std::invalid_argument);
}

TEST(MoePlacement, MaxOverlapKeepsTheMinimumReplicasOnDistinctNodes) {
  for (int e : {8, 16, 24}) {
    for (int f : {1, 2, 3}) {
      if (e * f > 60) continue;
      auto r = allocateReplicas(zipf(e, 1.2), 10, 6, f);
      Placement p = placeMaxOverlap(r, 10, 6);
      for (int x = 0; x < e; ++x) {
        EXPECT_GE(r[x], std::min(f, 10));
        int nodes = 0;
        for (auto& node : p) nodes += std::count(node.begin(), node.end(), x) > 0;
        EXPECT_GE(nodes, std::min(f, 10)) << e << " experts, f=" << f << ": expert " << x << " with " << r[x]
                                          << " replicas sits on " << nodes << " nodes";
        // The least replicated experts (the ones a failure can take) never
        // double up on a node.
        if (r[x] <= f) EXPECT_EQ(nodes, r[x]) << "expert " << x;
      }
    }
  }
}

// Over a sweep of shapes and loads, no expert doubles up on a node while
// a node lacking it exists (the repair moves other replicas aside when a
// single swap cannot help), and the replica counts and slots still hold.
TEST(MoePlacement, MaxOverlapNeverDoublesAnExpertUpWhileANodeLacksIt) {
  int cases = 0;
  for (int nodes : {2, 3, 4, 5, 8})
    for (int slots : {2, 3, 4, 6, 7, 12})
      for (int experts : {3, 4, 8, 16, 24, 64})
        for (int minReplicas : {1, 2, 3})
          for (double skew : {0.0, 0.8, 1.2, 2.0}) {
            if (experts * minReplicas > nodes * slots) continue;
            auto r = allocateReplicas(zipf(experts, skew), nodes, slots, minReplicas);
            Placement p = placeMaxOverlap(r, nodes, slots);
            expectValid(p, r, slots);
            for (int x = 0; x < experts; ++x) {
              int on = 0;
              for (auto& node : p) on += std::count(node.begin(), node.end(), x) > 0;
              ASSERT_EQ(on, std::min(r[x], nodes))
                  << nodes << " nodes x " << slots << " slots, " << experts << " experts, min " << minReplicas
                  << ", skew " << skew << ": expert " << x << " has " << r[x] << " replicas on " << on << " nodes";
            }
            ++cases;
          }
  EXPECT_GT(cases, 300);
}

TEST(MoePlacement, MaxOverlapSurvivesAtLeastAsOftenAsTheBaselines) {
  for (int e : {8, 16}) {
    auto r = allocateReplicas(zipf(e, 1.2), 10, 6, 2);
    auto mro = placeMaxOverlap(r, 10, 6), spread = placeSpread(r, 10, 6), compact = placeCompact(r, 10, 6);
    for (int k = 1; k <= 6; ++k) {
      double m = recoveryProbability(mro, e, k).probability;
      EXPECT_GE(m, recoveryProbability(spread, e, k).probability) << e << " experts, " << k << " failures";
      EXPECT_GE(m, recoveryProbability(compact, e, k).probability) << e << " experts, " << k << " failures";
    }
  }
}

TEST(MoeRecovery, ExactAndMonteCarloAgree) {
  auto r = allocateReplicas(zipf(16, 1.2), 10, 6, 2);
  auto p = placeSpread(r, 10, 6);
  for (int k : {2, 3, 4}) {
    RecoveryEstimate exact = recoveryProbability(p, 16, k);
    RecoveryEstimate mc = recoveryProbability(p, 16, k, /*exactLimit=*/0, 100000, 99);
    EXPECT_TRUE(exact.exact);
    EXPECT_FALSE(mc.exact);
    EXPECT_LE(mc.low, exact.probability) << k;
    EXPECT_GE(mc.high, exact.probability) << k;
    EXPECT_EQ(recoveryProbability(p, 16, k, 0, 1000, 5).probability,
              recoveryProbability(p, 16, k, 0, 1000, 5).probability) << "the estimate is not reproducible";
  }
  // Two replicas of one expert on nodes 0 and 1: losing both is 1 of C(3,2).
  Placement tiny{{0}, {0}, {1}};
  EXPECT_DOUBLE_EQ(recoveryProbability(tiny, 2, 1).probability, 2.0 / 3.0);
}

TEST(MoeMigration, MovesOnlyMissingReplicasFromSurvivorsSpreadOverOwners) {
  auto r = allocateReplicas(zipf(8, 1.2), 10, 6, 2);
  Placement current = placeMaxOverlap(r, 10, 6);
  Placement afterFailure = current;
  afterFailure[3].clear();
  auto r2 = allocateReplicas(zipf(8, 1.2), 9, 6, 2);
  Placement target = placeMaxOverlap(r2, 9, 6);
  MigrationPlan plan = planMigration(afterFailure, {3}, target);
  std::vector<bool> used(10, false);
  for (int q = 0; q < 9; ++q) {
    int p = plan.planToPhysical[q];
    ASSERT_GE(p, 0);
    EXPECT_NE(p, 3);
    EXPECT_FALSE(used[p]);
    used[p] = true;
    std::map<int, int> have;
    for (int e : afterFailure[p]) have[e]++;
    for (const Transfer& t : plan.transfers)
      if (t.toNode == p) have[t.expert]++;
    std::map<int, int> want;
    for (int e : target[q]) want[e]++;
    for (auto [e, k] : want) EXPECT_GE(have[e], k) << "plan node " << q << " lacks expert " << e;
  }
  std::map<int, std::map<int, int>> perOwner;
  for (const Transfer& t : plan.transfers) {
    EXPECT_NE(t.fromNode, 3) << "a transfer from the failed node";
    EXPECT_TRUE(std::count(afterFailure[t.fromNode].begin(), afterFailure[t.fromNode].end(), t.expert));
    perOwner[t.expert][t.fromNode]++;
  }
  for (auto& [e, owners] : perOwner) {
    int lo = 1 << 30, hi = 0;
    for (auto [node, k] : owners) lo = std::min(lo, k), hi = std::max(hi, k);
    EXPECT_LE(hi - lo, 1) << "expert " << e << "'s transfers are not spread over its owners";
  }
  // Same placement, no failure: nothing moves.
  EXPECT_TRUE(planMigration(current, {}, current).transfers.empty());
  Placement lost{{0}, {}, {1}};
  EXPECT_THROW(planMigration(lost, {1, 2}, Placement{{0, 1}}), std::invalid_argument);
}

TEST(MoeImport, Phy2LogBecomesPerRankReplicaCounts) {
  // 2 ranks x 3 slots: rank 0 holds experts 0,0,1; rank 1 holds 2,1,2.
  auto r = replicasFromPhy2Log({0, 0, 1, 2, 1, 2}, 3, 2);
  EXPECT_EQ(r, (std::vector<int32_t>{2, 0, 1, 1, 0, 2}));
  EXPECT_THROW(replicasFromPhy2Log({0, 5}, 3, 2), std::invalid_argument);
  EXPECT_THROW(replicasFromPhy2Log({0, 1, 2}, 3, 2), std::invalid_argument);
  EXPECT_EQ(replicasFromPlacement(Placement{{0, 0, 1}, {2, 1, 2}}, 3), r);
}

}  // namespace
}  // namespace eccl::moe
