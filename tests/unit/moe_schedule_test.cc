// The dispatch schedule's contract: quotas differ by at most one, local
// replicas first, every receiver gets exactly its quota, every row sums to
// the rank's tokens, every rank computes the same global answer alone, and
// the cost is O(E*N) (N=1024, E=256 within budget on one core).
#include <gtest/gtest.h>

#include <random>

#include "kernels/moe_schedule.h"

namespace eccl::moe {
namespace {

struct Case {
  int n, e;
  std::vector<int64_t> tokens;
  std::vector<int32_t> replicas;
  ScheduleInput input() const { return {n, e, tokens.data(), replicas.data()}; }
};

Case randomCase(int n, int e, uint64_t seed, int maxReplicas = 3) {
  std::mt19937_64 rng(seed);
  Case c{n, e, std::vector<int64_t>(size_t(n) * e), std::vector<int32_t>(size_t(e) * n, 0)};
  for (auto& t : c.tokens) t = static_cast<int64_t>(rng() % 50);
  for (int x = 0; x < e; ++x) {
    int count = 1 + static_cast<int>(rng() % maxReplicas);
    for (int k = 0; k < count; ++k) c.replicas[size_t(x) * n + rng() % n]++;
  }
  return c;
}

// Quota of each replica and capacity per rank, straight from the contract.
std::vector<int64_t> capacities(const Case& c, int e) {
  int64_t total = 0, reps = 0;
  for (int j = 0; j < c.n; ++j) total += c.tokens[size_t(j) * c.e + e], reps += c.replicas[size_t(e) * c.n + j];
  std::vector<int64_t> cap(c.n, 0);
  int64_t k = 0;
  for (int j = 0; j < c.n; ++j)
    for (int r = 0; r < c.replicas[size_t(e) * c.n + j]; ++r, ++k) cap[j] += total / reps + (k < total % reps);
  return cap;
}

TEST(MoeSchedule, RowsSumToTokensAndReceiversGetExactlyTheirQuota) {
  for (uint64_t seed = 1; seed <= 30; ++seed) {
    Case c = randomCase(1 + int(seed % 9), 1 + int(seed % 13), seed);
    auto all = computeGlobalSchedule(c.input());
    for (int e = 0; e < c.e; ++e) {
      auto cap = capacities(c, e);
      for (int j = 0; j < c.n; ++j) {
        int64_t got = 0;
        for (int i = 0; i < c.n; ++i) got += all[(size_t(i) * c.e + e) * c.n + j];
        EXPECT_EQ(got, cap[j]) << "seed " << seed << " expert " << e << " receiver " << j;
      }
      for (int i = 0; i < c.n; ++i) {
        int64_t row = 0;
        for (int j = 0; j < c.n; ++j) {
          int64_t k = all[(size_t(i) * c.e + e) * c.n + j];
          EXPECT_GE(k, 0);
          if (k > 0) EXPECT_GT(c.replicas[size_t(e) * c.n + j], 0) << "tokens sent to a rank without a replica";
          row += k;
        }
        EXPECT_EQ(row, c.tokens[size_t(i) * c.e + e]);
        // Local first: a rank keeps all it can before sending anything away.
        int64_t local = all[(size_t(i) * c.e + e) * c.n + i];
        EXPECT_EQ(local, std::min(c.tokens[size_t(i) * c.e + e], cap[i])) << "seed " << seed;
      }
    }
  }
}

TEST(MoeSchedule, ReceiveSideMatchesWhatTheSendersComputed) {
  Case c = randomCase(7, 11, 42);
  auto all = computeGlobalSchedule(c.input());
  for (int j = 0; j < c.n; ++j) {
    RankSchedule s = computeSchedule(c.input(), j);
    int64_t totalIn = 0;
    for (size_t k = 0; k < s.localExperts.size(); ++k) {
      int e = s.localExperts[k];
      EXPECT_GT(c.replicas[size_t(e) * c.n + j], 0);
      for (int i = 0; i < c.n; ++i) EXPECT_EQ(s.recv[k * c.n + i], all[(size_t(i) * c.e + e) * c.n + j]);
    }
    for (int i = 0; i < c.n; ++i) totalIn += s.recvFromRank[i];
    int64_t fromSenders = 0;
    for (int i = 0; i < c.n; ++i)
      for (int e = 0; e < c.e; ++e) fromSenders += all[(size_t(i) * c.e + e) * c.n + j];
    EXPECT_EQ(totalIn, fromSenders);
  }
}

// The overflow step read literally: every sender's interval against every
// receiver's, O(N^2) per expert, on small random tables of every shape
// (sparse and dense replicas, ranks with nothing, experts with nothing).
TEST(MoeSchedule, EqualsTheContractReadLiterally) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 400; ++trial) {
    int n = 1 + static_cast<int>(rng() % 24), e = 1 + static_cast<int>(rng() % 12);
    Case c = randomCase(n, e, rng(), trial % 3 == 0 ? n + 2 : 3);
    for (auto& t : c.tokens)
      if (rng() % 4 == 0) t = 0;
    for (int i = 0; i < n; ++i) {
      RankSchedule s = computeSchedule(c.input(), i);
      std::vector<int64_t> wantRecv;
      std::vector<int32_t> wantLocal;
      for (int x = 0; x < e; ++x) {
        std::vector<int64_t> cap = capacities(c, x), keep(n), over(n), resid(n);
        for (int j = 0; j < n; ++j) {
          keep[j] = std::min(c.tokens[size_t(j) * e + x], cap[j]);
          over[j] = c.tokens[size_t(j) * e + x] - keep[j];
          resid[j] = cap[j] - keep[j];
        }
        auto share = [&](int from, int to) {  // overflow of `from` landing on `to`
          int64_t a = 0, b = 0;
          for (int j = 0; j < from; ++j) a += over[j];
          for (int j = 0; j < to; ++j) b += resid[j];
          return std::max<int64_t>(0, std::min(a + over[from], b + resid[to]) - std::max(a, b));
        };
        for (int j = 0; j < n; ++j)
          ASSERT_EQ(s.send[size_t(x) * n + j], (j == i ? keep[i] : 0) + share(i, j))
              << "trial " << trial << " rank " << i << " expert " << x << " to " << j;
        if (c.replicas[size_t(x) * n + i] == 0) continue;
        wantLocal.push_back(x);
        for (int j = 0; j < n; ++j) wantRecv.push_back((j == i ? keep[i] : 0) + share(j, i));
      }
      ASSERT_EQ(s.localExperts, wantLocal) << "trial " << trial << " rank " << i;
      ASSERT_EQ(s.recv, wantRecv) << "trial " << trial << " rank " << i;
    }
  }
}

TEST(MoeSchedule, KnownSmallCase) {
  // 2 ranks, 1 expert with a replica on each; rank 0 has 10 tokens, rank 1
  // has 2: quotas 6 and 6; rank 0 keeps 6 and sends 4 to rank 1.
  Case c{2, 1, {10, 2}, {1, 1}};
  auto s0 = computeSchedule(c.input(), 0);
  EXPECT_EQ(s0.send, (std::vector<int64_t>{6, 4}));
  auto s1 = computeSchedule(c.input(), 1);
  EXPECT_EQ(s1.send, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(s1.recv, (std::vector<int64_t>{4, 2}));
  // Odd total: 13 tokens over 2 replicas: the lower rank's replica gets 7.
  Case d{2, 1, {3, 10}, {1, 1}};
  EXPECT_EQ(computeSchedule(d.input(), 1).send, (std::vector<int64_t>{4, 6}));
}

TEST(MoeSchedule, BadInputIsAClearError) {
  Case c{2, 1, {5, 0}, {0, 0}};
  EXPECT_THROW(computeSchedule(c.input(), 0), std::invalid_argument);
  Case d{2, 1, {-1, 0}, {1, 0}};
  EXPECT_THROW(computeSchedule(d.input(), 0), std::invalid_argument);
  Case e{2, 1, {1, 0}, {1, 0}};
  EXPECT_THROW(computeSchedule(e.input(), 2), std::invalid_argument);
  try {
    computeSchedule(c.input(), 0);
  } catch (const std::invalid_argument& x) {
    EXPECT_NE(std::string(x.what()).find("expert 0"), std::string::npos) << x.what();
  }
}

TEST(MoeSchedule, LargeScaleStaysConsistent) {
  // N=1024, E=256 (its time is a benchmark figure: perf/dispatch_perf).
  Case c = randomCase(1024, 256, 7, 4);
  for (int rank : {0, 513, 1023}) {
    RankSchedule s = computeSchedule(c.input(), rank);
    int64_t sent = 0, mine = 0;
    for (int64_t v : s.sendToRank) sent += v;
    for (int e = 0; e < 256; ++e) mine += c.tokens[size_t(rank) * 256 + e];
    EXPECT_EQ(sent, mine);
  }
}

}  // namespace
}  // namespace eccl::moe
