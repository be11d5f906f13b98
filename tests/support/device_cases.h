// Inputs the device-buffer tests share (tests/cuda on a GPU,
// tests/multiproc/stream_path_test on the host emulation), and the host
// runs their results are compared with.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tests/support/multiproc.h"

namespace eccl::test {

inline std::vector<float> pattern(int rank, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 7 + rank * 13) % 251) - 125.0f;
  return v;
}

// A MoE dispatch with uneven replicas (expert 0 everywhere, expert 3 twice
// on one rank), some empty choices, and a token count that differs by rank.
struct MoeCase {
  int experts = 5, topk = 2, hidden = 24;
  int64_t tokens = 0;
  std::vector<int32_t> replicas, route;
  std::vector<float> x, weights;
};

inline MoeCase moeCase(int rank, int n) {
  MoeCase c;
  c.tokens = 300 + 17 * rank;
  c.replicas.assign(c.experts * n, 0);
  for (int j = 0; j < n; ++j) c.replicas[j] = 1;
  for (int e = 1; e < c.experts; ++e) c.replicas[e * n + e % n] += 1 + (e == 3);
  c.route.resize(c.tokens * c.topk);
  for (int64_t t = 0; t < c.tokens; ++t) {
    c.route[t * c.topk] = static_cast<int32_t>((t * 7 + rank) % c.experts);
    c.route[t * c.topk + 1] = t % 5 == 0 ? -1 : static_cast<int32_t>((t * 3 + 1) % c.experts);
  }
  c.x = pattern(rank, c.tokens * c.hidden);
  c.weights.resize(c.tokens * c.topk);
  for (size_t i = 0; i < c.weights.size(); ++i) c.weights[i] = 0.25f + 0.125f * float(i % 5);
  return c;
}

// The case dispatched and combined on host buffers (experts: identity).
struct MoeOnHost {
  ecclMoePlan_t plan = nullptr;
  void* rows = nullptr;
  int q = 0;
  const int32_t* local = nullptr;
  const int64_t *count = nullptr, *offset = nullptr;
  int64_t rowCount = 0;
  std::vector<float> out;
};

inline MoeOnHost moeOnHost(MoeCase& c, ecclComm_t comm) {
  MoeOnHost h;
  RANK_OK(ecclMoeDispatch(c.x.data(), c.route.data(), c.tokens, c.topk, c.hidden, ecclFloat32, c.replicas.data(),
                          c.experts, &h.plan, comm, nullptr), comm);
  RANK_OK(ecclMoeExpertInput(h.plan, &h.rows, &h.q, &h.local, &h.count, &h.offset), comm);
  h.rowCount = h.q ? h.offset[h.q - 1] + h.count[h.q - 1] : 0;
  h.out.resize(c.tokens * c.hidden);
  RANK_OK(ecclMoeCombine(h.plan, h.rows, c.weights.data(), h.out.data(), comm, nullptr), comm);
  return h;
}

// A device plan's expert input, checked to have the host plan's layout.
inline void* expertRowsLikeTheHost(ecclMoePlan_t plan, const MoeOnHost& host, ecclComm_t comm) {
  void* rows = nullptr;
  int q = 0;
  const int32_t* local = nullptr;
  const int64_t *count = nullptr, *offset = nullptr;
  RANK_OK(ecclMoeExpertInput(plan, &rows, &q, &local, &count, &offset), comm);
  RANK_CHECK(q == host.q && std::equal(local, local + q, host.local) && std::equal(count, count + q, host.count) &&
                 std::equal(offset, offset + q, host.offset),
             "the device dispatch's layout differs from the host dispatch's");
  return rows;
}

}  // namespace eccl::test
