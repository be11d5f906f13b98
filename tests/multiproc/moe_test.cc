// ecclMoeDispatch / ecclMoeCombine across real processes: uneven replicas
// (an expert with three replicas, one with two on the same rank), skewed
// routing, every rank's experts applied on the received rows, and the
// combined output checked against a direct computation on every rank;
// bytes exchanged are exactly the routed rows (no padding).
#include <gtest/gtest.h>

#include <random>
#include <vector>

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

TEST(Moe, DispatchAndCombineOverUnevenReplicas) {
  ProcessGroup group(kRanks, [](int rank, int n, const ecclUniqueId& id) {
    setenv("ECCL_SOCKET_IFNAME", "lo", 1);
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, n, id, rank), nullptr);
    auto replicas = replicaTable();
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
    int hosted = 0;
    for (int e = 0; e < kExperts; ++e) hosted += replicas[e * kRanks + rank] > 0;
    RANK_CHECK(q == hosted, "local experts " + std::to_string(q));
    auto* f = static_cast<float*>(rows);
    int64_t received = 0;
    for (int k = 0; k < q; ++k) {
      received += count[k];
      for (int64_t r = offset[k]; r < offset[k] + count[k]; ++r)
        for (int h = 0; h < kHidden; ++h) f[r * kHidden + h] = expertFn(local[k], f[r * kHidden + h]);
    }
    // No padding: the rows received over all ranks are exactly the routed choices.
    int64_t routed = 0;
    for (int32_t e : topk) routed += e >= 0;
    int64_t totals[2] = {received, routed};
    RANK_OK(ecclAllReduce(totals, totals, 2, ecclInt64, ecclSum, comm, nullptr), comm);
    RANK_CHECK(totals[0] == totals[1], "received " + std::to_string(totals[0]) + " rows for " +
                                           std::to_string(totals[1]) + " routed choices");
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
    // Bad input is a clear error on every rank (checked before any exchange).
    std::vector<int32_t> bad = topk;
    bad[3] = kExperts;
    ecclMoePlan_t none;
    RANK_CHECK(ecclMoeDispatch(x.data(), bad.data(), kTokens, kTopk, kHidden, ecclFloat32, replicas.data(), kExperts,
                               &none, comm, nullptr) == ecclInvalidArgument,
               "out-of-range expert accepted");
    RANK_CHECK(std::string(ecclGetLastError(comm)).find("names expert 6") != std::string::npos, ecclGetLastError(comm));
    RANK_OK(ecclMoePlanDestroy(plan), comm);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

}  // namespace
}  // namespace eccl::test
