// ecclMoeDispatch / ecclMoeCombine across real processes: uneven replicas
// (an expert with three replicas, one with two on the same rank), skewed
// routing, every rank's experts applied on the received rows, and the
// combined output checked against a direct computation on every rank;
// bytes exchanged are exactly the routed rows (no padding).
#include <gtest/gtest.h>
#include <signal.h>

#include <thread>

#include <random>
#include <vector>

#include "kernels/moe_placement.h"
#include "tests/support/multiproc.h"

namespace eccl::test {
namespace {

constexpr int kRanks = 4, kExperts = 6, kTopk = 2, kTokens = 200, kHidden = 16;

// replicas[e][j]
std::vector<int32_t> replicaTable() {
  std::vector<int32_t> r(kExperts * kRanks, 0);
  auto put = [&](int e, int j) { r[e * kRanks + j]++; };
  put(0, 0), put(0, 1), put(0, 3);  // popular: three replicas
  put(1, 2), put(1, 2);             // two replicas on one rank
  put(2, 1), put(3, 3), put(4, 0), put(5, 2);
  return r;
}

std::vector<int32_t> routing(int rank) {
  std::mt19937 rng(100 + rank);
  std::vector<int32_t> t(kTokens * kTopk);
  for (int i = 0; i < kTokens; ++i) {
    int a = rng() % 3 == 0 ? int(rng() % kExperts) : 0;  // skewed to expert 0
    int b = int(rng() % kExperts);
    t[i * 2] = a;
    t[i * 2 + 1] = b == a ? -1 : b;
  }
  return t;
}

float expertFn(int e, float v) { return v * float(e + 2) - 1.0f; }

// One dispatch + per-expert map + combine, checked element by element
// against the direct computation; returns the rows this rank received.
int64_t dispatchAndCheck(ecclComm_t comm, const std::vector<int32_t>& replicas, int rank) {
  auto topk = routing(rank);
  std::vector<float> x(kTokens * kHidden);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(rank * 10000 + int(i)) * 0.25f;
  ecclMoePlan_t plan;
  RANK_OK(ecclMoeDispatch(x.data(), topk.data(), kTokens, kTopk, kHidden, ecclFloat32, replicas.data(), kExperts,
                          &plan, comm, nullptr),
          comm);
  void* rows;
  int q;
  const int32_t* local;
  const int64_t *count, *offset;
  RANK_OK(ecclMoeExpertInput(plan, &rows, &q, &local, &count, &offset), comm);
  int n, hosted = 0;
  RANK_OK(ecclCommCount(comm, &n), comm);
  for (int e = 0; e < kExperts; ++e) hosted += replicas[e * n + rank] > 0;
  RANK_CHECK(q == hosted, "local experts " + std::to_string(q) + ", hosted " + std::to_string(hosted));
  auto* f = static_cast<float*>(rows);
  int64_t received = 0;
  for (int k = 0; k < q; ++k) {
    received += count[k];
    for (int64_t r = offset[k]; r < offset[k] + count[k]; ++r)
      for (int h = 0; h < kHidden; ++h) f[r * kHidden + h] = expertFn(local[k], f[r * kHidden + h]);
  }
  std::vector<float> weights(kTokens * kTopk), out(kTokens * kHidden);
  for (size_t i = 0; i < weights.size(); ++i) weights[i] = 0.5f + 0.25f * float(i % 3);
  RANK_OK(ecclMoeCombine(plan, rows, weights.data(), out.data(), comm, nullptr), comm);
  for (int t = 0; t < kTokens; ++t)
    for (int h = 0; h < kHidden; ++h) {
      float want = 0;
      for (int s = 0; s < kTopk; ++s) {
        int e = topk[t * kTopk + s];
        if (e >= 0) want += weights[t * kTopk + s] * expertFn(e, x[t * kHidden + h]);
      }
      RANK_CHECK(out[t * kHidden + h] == want, "token " + std::to_string(t) + " h " + std::to_string(h));
    }
  RANK_OK(ecclMoePlanDestroy(plan), comm);
  return received;
}

TEST(Moe, DispatchContinuesOnAPlacementRecomputedAfterANodeIsLost) {
  constexpr int kSlots = 3, victim = 3;
  ProcessGroup group(kRanks, [](int rank, int n, const ecclUniqueId& id) {
    setenv("ECCL_SOCKET_IFNAME", "lo", 1);
    setenv("ECCL_HEARTBEAT_MS", "100", 1);
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, n, id, rank), nullptr);
    // Load per expert from everyone's routing; replicas by load, placed by MRO.
    std::vector<double> load(kExperts, 0);
    for (int r = 0; r < n; ++r)
      for (int32_t e : routing(r))
        if (e >= 0) load[e] += 1;
    auto before = eccl::moe::placeMaxOverlap(eccl::moe::allocateReplicas(load, n, kSlots, 1), n, kSlots);
    dispatchAndCheck(comm, eccl::moe::replicasFromPlacement(before, kExperts), rank);
    if (rank == victim) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      raise(SIGKILL);
    }
    float v = 1;
    RANK_CHECK(ecclAllReduce(&v, &v, 1, ecclFloat32, ecclSum, comm, nullptr) != ecclSuccess, "the loss went unseen");
    RANK_OK(ecclCommRecover(comm, ecclRecoverShrink), comm);
    int m;
    RANK_OK(ecclCommCount(comm, &m), comm);
    RANK_CHECK(m == n - 1, "after the shrink: " + std::to_string(m) + " ranks");
    // A new placement for the survivors, and the plan to get there: every
    // transfer comes from a surviving owner.
    auto after = eccl::moe::placeMaxOverlap(eccl::moe::allocateReplicas(load, m, kSlots, 1), m, kSlots);
    auto lost = before;
    lost[victim].clear();
    auto plan = eccl::moe::planMigration(lost, {victim}, after);
    for (const auto& t : plan.transfers) RANK_CHECK(t.fromNode != victim && t.toNode != victim, "transfer via the lost node");
    // Survivors keep their numbers below the victim, so plan node q lives on
    // physical node planToPhysical[q] == new rank q.
    for (int q = 0; q < m; ++q) RANK_CHECK(plan.planToPhysical[q] != victim, "a plan node mapped to the lost node");
    std::vector<eccl::moe::Placement::value_type> byRank(m);
    for (int q = 0; q < m; ++q) byRank[plan.planToPhysical[q]] = after[q];
    dispatchAndCheck(comm, eccl::moe::replicasFromPlacement(byRank, kExperts), rank);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  for (size_t r = 0; r < outcomes.size(); ++r) {
    if (int(r) == victim) EXPECT_TRUE(!outcomes[r].exited && outcomes[r].signal == SIGKILL) << describe(outcomes);
    else EXPECT_TRUE(outcomes[r].exited && outcomes[r].exitCode == 0) << describe(outcomes);
  }
}

TEST(Moe, DispatchAndCombineOverUnevenReplicas) {
  ProcessGroup group(kRanks, [](int rank, int n, const ecclUniqueId& id) {
    setenv("ECCL_SOCKET_IFNAME", "lo", 1);
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, n, id, rank), nullptr);
    auto replicas = replicaTable();
    auto topk = routing(rank);
    int64_t received = dispatchAndCheck(comm, replicas, rank);
    // No padding: the rows received over all ranks are exactly the routed choices.
    int64_t routed = 0;
    for (int32_t e : topk) routed += e >= 0;
    int64_t totals[2] = {received, routed};
    RANK_OK(ecclAllReduce(totals, totals, 2, ecclInt64, ecclSum, comm, nullptr), comm);
    RANK_CHECK(totals[0] == totals[1], "received " + std::to_string(totals[0]) + " rows for " +
                                           std::to_string(totals[1]) + " routed choices");
    std::vector<float> x(kTokens * kHidden);
    // Bad input is a clear error on every rank (checked before any exchange).
    std::vector<int32_t> bad = topk;
    bad[3] = kExperts;
    ecclMoePlan_t none;
    RANK_CHECK(ecclMoeDispatch(x.data(), bad.data(), kTokens, kTopk, kHidden, ecclFloat32, replicas.data(), kExperts,
                               &none, comm, nullptr) == ecclInvalidArgument,
               "out-of-range expert accepted");
    RANK_CHECK(std::string(ecclGetLastError(comm)).find("names expert 6") != std::string::npos, ecclGetLastError(comm));
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

// The calls the backward passes use: rows along an existing plan (per
// token and per choice) and combine without weights, in float64 (pure data
// movement: any type). Per choice, combine(dispatchAlong(R)) returns R
// exactly (zeros for no choice); per token, dispatchAlong(x) equals the
// dispatch's own rows.
TEST(Moe, RowsAlongAPlanAndPerChoiceCombineInvertEachOther) {
  ProcessGroup group(3, [](int rank, int n, const ecclUniqueId& id) {
    setenv("ECCL_SOCKET_IFNAME", "lo", 1);
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, n, id, rank), nullptr);
    std::vector<int32_t> replicas(kExperts * n, 0);
    for (int e = 0; e < kExperts; ++e) replicas[e * n + e % n] = 1 + (e == 0);  // two replicas of expert 0 on rank 0
    replicas[1 * n + 2] = 1;
    auto topk = routing(rank);
    std::vector<double> x(kTokens * kHidden);
    for (size_t i = 0; i < x.size(); ++i) x[i] = double(rank) + 1e-3 * double(i);
    ecclMoePlan_t plan;
    RANK_OK(ecclMoeDispatch(x.data(), topk.data(), kTokens, kTopk, kHidden, ecclFloat64, replicas.data(), kExperts,
                            &plan, comm, nullptr),
            comm);
    void* rows;
    int q;
    const int32_t* local;
    const int64_t *count, *offset;
    RANK_OK(ecclMoeExpertInput(plan, &rows, &q, &local, &count, &offset), comm);
    int64_t total = 0;
    for (int k = 0; k < q; ++k) total += count[k];
    std::vector<double> again(total * kHidden);
    RANK_OK(ecclMoeDispatchAlong(plan, x.data(), 0, again.data(), comm, nullptr), comm);
    RANK_CHECK(std::equal(again.begin(), again.end(), static_cast<double*>(rows)), "per-token rows differ");
    std::vector<double> perChoice(kTokens * kTopk * kHidden), back(perChoice.size(), -1.0), moved(total * kHidden);
    for (size_t i = 0; i < perChoice.size(); ++i) perChoice[i] = double(rank * 1000000 + int(i));
    RANK_OK(ecclMoeDispatchAlong(plan, perChoice.data(), 1, moved.data(), comm, nullptr), comm);
    RANK_OK(ecclMoeCombine(plan, moved.data(), nullptr, back.data(), comm, nullptr), comm);
    for (int t = 0; t < kTokens; ++t)
      for (int s = 0; s < kTopk; ++s)
        for (int h = 0; h < kHidden; ++h) {
          size_t i = (size_t(t) * kTopk + s) * kHidden + h;
          double want = topk[t * kTopk + s] >= 0 ? perChoice[i] : 0.0;
          RANK_CHECK(back[i] == want, "token " + std::to_string(t) + " choice " + std::to_string(s));
        }
    // A weighted combine of float64 is refused, saying what works.
    std::vector<float> w(kTokens * kTopk, 1.0f);
    RANK_CHECK(ecclMoeCombine(plan, moved.data(), w.data(), back.data(), comm, nullptr) == ecclInvalidArgument,
               "weighted float64 combine accepted");
    RANK_CHECK(std::string(ecclGetLastError(comm)).find("weights NULL") != std::string::npos, ecclGetLastError(comm));
    RANK_OK(ecclMoePlanDestroy(plan), comm);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

// One rank's bad routing or a replica table that differs on one rank:
// every rank fails the dispatch naming that rank, and the group goes on.
TEST(Moe, EveryRankNamesTheRankWhoseInputIsBad) {
  ProcessGroup group(3, [](int rank, int n, const ecclUniqueId& id) {
    setenv("ECCL_SOCKET_IFNAME", "lo", 1);
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, n, id, rank), nullptr);
    std::vector<int32_t> replicas(kExperts * n, 1);
    auto topk = routing(rank);
    std::vector<float> x(kTokens * kHidden, 1.0f);
    ecclMoePlan_t plan;
    auto bad = topk;
    if (rank == 1) bad[7] = 40;
    RANK_CHECK(ecclMoeDispatch(x.data(), bad.data(), kTokens, kTopk, kHidden, ecclFloat32, replicas.data(), kExperts,
                               &plan, comm, nullptr) == ecclInvalidArgument,
               "a bad expert id on rank 1 was accepted");
    RANK_CHECK(std::string(ecclGetLastError(comm)).find("rank 1's token 3 choice 1 names expert 40") !=
                   std::string::npos,
               ecclGetLastError(comm));
    auto odd = replicas;
    if (rank == 2) odd[5] = 3;
    RANK_CHECK(ecclMoeDispatch(x.data(), topk.data(), kTokens, kTopk, kHidden, ecclFloat32, odd.data(), kExperts,
                               &plan, comm, nullptr) == ecclInvalidArgument,
               "differing replica tables accepted");
    const std::string why = ecclGetLastError(comm);
    RANK_CHECK(why.find("replica table differs between ranks") != std::string::npos &&
                   why.find(rank == 2 ? "rank 0's" : "rank 2's") != std::string::npos,
               why);
    float v = 1;
    RANK_OK(ecclAllReduce(&v, &v, 1, ecclFloat32, ecclSum, comm, nullptr), comm);
    RANK_CHECK(v == 3.0f, "the group broke after the refused dispatches");
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

}  // namespace
}  // namespace eccl::test
