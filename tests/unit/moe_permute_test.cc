// Permute and combine (CPU reference): the send buffer is ordered by
// destination rank, then expert, token order kept; regroup and ungroup are
// inverses; combine is the weighted sum in float32, deterministic; bad
// routing is a clear error. A whole exchange is simulated in memory:
// every rank's permute, the all-to-all-v as copies, each expert as a known
// function, the reverse exchange and combine, checked against a direct
// computation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "coll/reduce.h"
#include "kernels/moe_permute.h"

namespace eccl::moe {
namespace {

struct World {
  int n, E, k, T, H;
  std::vector<std::vector<int32_t>> topk;  // per rank [T*k]
  std::vector<int64_t> tokens;             // [n][E]
  std::vector<int32_t> replicas;           // [E][n]
  ScheduleInput input() const { return {n, E, tokens.data(), replicas.data()}; }
};

World makeWorld(uint64_t seed) {
  std::mt19937_64 rng(seed);
  World w{4, 6, 2, 50, 8, {}, {}, {}};
  w.tokens.assign(size_t(w.n) * w.E, 0);
  w.replicas.assign(size_t(w.E) * w.n, 0);
  for (int e = 0; e < w.E; ++e) {
    int reps = 1 + int(rng() % 3);
    for (int r = 0; r < reps; ++r) w.replicas[size_t(e) * w.n + rng() % w.n]++;
  }
  for (int r = 0; r < w.n; ++r) {
    std::vector<int32_t> t(size_t(w.T) * w.k);
    for (int i = 0; i < w.T; ++i) {
      // Skewed routing, two distinct experts or none in the second slot.
      int a = int(std::min<uint64_t>(rng() % 10, w.E - 1)), b = int(rng() % w.E);
      t[i * 2] = a;
      t[i * 2 + 1] = (b == a || rng() % 5 == 0) ? -1 : b;
    }
    for (int32_t e : t)
      if (e >= 0) w.tokens[size_t(r) * w.E + e]++;
    w.topk.push_back(t);
  }
  return w;
}

// Expert e turns a row v into v * (e + 1) + 0.5.
float expertFn(int e, float v) { return v * float(e + 1) + 0.5f; }

TEST(MoePermute, FullExchangeMatchesADirectComputation) {
  World w = makeWorld(3);
  const size_t rowBytes = w.H * sizeof(float);
  std::vector<RankSchedule> sched;
  std::vector<PermutePlan> plans;
  std::vector<std::vector<float>> x(w.n), sendBuf(w.n);
  for (int r = 0; r < w.n; ++r) {
    sched.push_back(computeSchedule(w.input(), r));
    plans.push_back(planPermute(w.topk[r].data(), w.T, w.k, sched[r], w.E));
    x[r].resize(size_t(w.T) * w.H);
    for (size_t i = 0; i < x[r].size(); ++i) x[r][i] = float(r * 1000 + int(i));
    sendBuf[r].resize(size_t(plans[r].sendRows) * w.H);
    permuteRows(x[r].data(), rowBytes, w.T, w.k, plans[r], sendBuf[r].data());
  }
  // The all-to-all-v and the experts, then the way back.
  std::vector<std::vector<float>> back(w.n);
  for (int r = 0; r < w.n; ++r) back[r].resize(sendBuf[r].size());
  for (int j = 0; j < w.n; ++j) {
    ReceiveLayout layout = planReceive(sched[j]);
    std::vector<float> recv(size_t(layout.recvRows) * w.H);
    for (int i = 0; i < w.n; ++i) {
      ASSERT_EQ(plans[i].sendRowsTo[j], sched[j].recvFromRank[i]) << "sender and receiver disagree";
      std::memcpy(&recv[size_t(layout.recvRowOffset[i]) * w.H],
                  &sendBuf[i][size_t(plans[i].sendRowOffset[j]) * w.H], plans[i].sendRowsTo[j] * rowBytes);
    }
    std::vector<float> grouped(recv.size()), ungrouped(recv.size());
    regroupRows(recv.data(), rowBytes, layout, grouped.data());
    for (size_t q = 0; q < sched[j].localExperts.size(); ++q)
      for (int64_t row = layout.expertOffset[q]; row < layout.expertOffset[q] + layout.expertRows[q]; ++row)
        for (int h = 0; h < w.H; ++h) grouped[row * w.H + h] = expertFn(sched[j].localExperts[q], grouped[row * w.H + h]);
    ungroupRows(grouped.data(), rowBytes, layout, ungrouped.data());
    for (int i = 0; i < w.n; ++i)
      std::memcpy(&back[i][size_t(plans[i].sendRowOffset[j]) * w.H], &ungrouped[size_t(layout.recvRowOffset[i]) * w.H],
                  plans[i].sendRowsTo[j] * rowBytes);
  }
  for (int r = 0; r < w.n; ++r) {
    std::vector<float> weights(size_t(w.T) * w.k);
    for (size_t i = 0; i < weights.size(); ++i) weights[i] = 0.25f + 0.5f * float(i % 3);
    std::vector<float> out(size_t(w.T) * w.H);
    combineRows(back[r].data(), weights.data(), w.T, w.k, w.H, ecclFloat32, plans[r], out.data());
    for (int t = 0; t < w.T; ++t)
      for (int h = 0; h < w.H; ++h) {
        float want = 0;
        for (int s = 0; s < w.k; ++s) {
          int e = w.topk[r][t * w.k + s];
          if (e >= 0) want += weights[t * w.k + s] * expertFn(e, x[r][size_t(t) * w.H + h]);
        }
        ASSERT_EQ(out[size_t(t) * w.H + h], want) << "rank " << r << " token " << t << " h " << h;
      }
  }
}

TEST(MoePermute, SendBufferIsRankThenExpertMajorInTokenOrder) {
  World w = makeWorld(9);
  RankSchedule s = computeSchedule(w.input(), 1);
  PermutePlan p = planPermute(w.topk[1].data(), w.T, w.k, s, w.E);
  // Walk rows in order: (destination, expert) never decreases, and within
  // one (destination, expert) chunk the token index increases.
  std::vector<std::tuple<int64_t, int, int>> rows;  // row, expert, token
  for (int i = 0; i < w.T * w.k; ++i)
    if (p.rowOf[i] >= 0) rows.push_back({p.rowOf[i], w.topk[1][i], i / w.k});
  std::sort(rows.begin(), rows.end());
  ASSERT_EQ(int64_t(rows.size()), p.sendRows);
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(std::get<0>(rows[i]), int64_t(i)) << "rows are not dense";
  auto destOf = [&](int64_t row) {
    int j = 0;
    while (j + 1 < w.n && p.sendRowOffset[j + 1] <= row) ++j;
    return j;
  };
  for (size_t i = 1; i < rows.size(); ++i) {
    auto [r0, e0, t0] = rows[i - 1];
    auto [r1, e1, t1] = rows[i];
    auto a = std::make_pair(destOf(r0), e0), b = std::make_pair(destOf(r1), e1);
    EXPECT_LE(a, b);
    if (a == b) EXPECT_LT(t0, t1);
  }
}

// Wider top-k with unused slots anywhere: the sum is still the rounded
// products added left to right from 0 (what the CUDA kernel computes).
TEST(MoePermute, CombineAddsEveryUsedSlotInOrder) {
  constexpr int T = 9, k = 5, H = 33, rows = 20;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> val(-3.0f, 3.0f);
  std::vector<float> y(size_t(rows) * H), weights(size_t(T) * k), out(size_t(T) * H, 42.0f);
  for (float& v : y) v = val(rng);
  for (float& v : weights) v = val(rng);
  PermutePlan plan;
  for (int i = 0; i < T * k; ++i) plan.rowOf.push_back(rng() % 3 == 0 ? -1 : int64_t(rng() % rows));
  for (int s = 0; s < k; ++s) plan.rowOf[size_t(2) * k + s] = -1;  // a token with no expert: zeros
  combineRows(y.data(), weights.data(), T, k, H, ecclFloat32, plan, out.data());
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      float want = 0;
      for (int s = 0; s < k; ++s)
        if (int64_t r = plan.rowOf[size_t(t) * k + s]; r >= 0) want += weights[size_t(t) * k + s] * y[size_t(r) * H + h];
      ASSERT_EQ(out[size_t(t) * H + h], want) << "token " << t << " h " << h;
    }
}

TEST(MoePermute, CombineRoundsOnceForHalfTypes) {
  // One token, two choices; y rows in bfloat16 and float16.
  PermutePlan plan;
  plan.rowOf = {0, 1};
  const float a = 1.00390625f, b = 3.0f, wa = 0.5f, wb = 0.25f;
  for (ecclDataType_t t : {ecclFloat16, ecclBfloat16}) {
    uint16_t y[2], out;
    float rows[2] = {a, b};
    coll::narrowFromFloat(rows, y, 2, t);
    float wide[2];
    coll::widenToFloat(y, wide, 2, t);
    float weights[2] = {wa, wb};
    combineRows(y, weights, 1, 2, 1, t, plan, &out);
    float sum = wa * wide[0] + wb * wide[1];
    uint16_t want;
    coll::narrowFromFloat(&sum, &want, 1, t);
    EXPECT_EQ(out, want);
  }
  float y32[2] = {a, b}, out32, w2[2] = {wa, wb};
  EXPECT_THROW(combineRows(y32, w2, 1, 2, 1, ecclInt32, plan, &out32), std::invalid_argument);
}

TEST(MoePermute, RoutingThatDisagreesWithTheScheduleIsAClearError) {
  World w = makeWorld(5);
  RankSchedule s = computeSchedule(w.input(), 0);
  std::vector<int32_t> bad = w.topk[0];
  bad[0] = 99;
  EXPECT_THROW(planPermute(bad.data(), w.T, w.k, s, w.E), std::invalid_argument);
  bad = w.topk[0];
  bad[0] = bad[0] == 0 ? 1 : 0;  // one token moved to another expert
  try {
    planPermute(bad.data(), w.T, w.k, s, w.E);
    ADD_FAILURE() << "mismatched routing accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("schedule sends"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace eccl::moe
