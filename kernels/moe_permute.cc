#include "kernels/moe_permute.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "coll/reduce.h"

namespace eccl::moe {

PermutePlan planPermute(const int32_t* topk, int64_t tokens, int k, const RankSchedule& s, int E) {
  const int n = static_cast<int>(s.sendToRank.size());
  if (tokens < 0 || k < 1 || (tokens > 0 && !topk) || static_cast<int64_t>(s.send.size()) != int64_t(E) * n)
    throw std::invalid_argument("moe permute: need tokens >= 0, k >= 1, topk, and a schedule of " + std::to_string(E) +
                                " experts");
  std::vector<int64_t> perExpert(E, 0);
  for (int64_t i = 0; i < tokens * k; ++i) {
    int32_t e = topk[i];
    if (e == -1) continue;
    if (e < 0 || e >= E)
      throw std::invalid_argument("moe permute: token " + std::to_string(i / k) + " choice " + std::to_string(i % k) +
                                  " names expert " + std::to_string(e) + ", outside [0, " + std::to_string(E) + ")");
    perExpert[e]++;
  }
  PermutePlan plan;
  plan.sendRowsTo = s.sendToRank;
  plan.sendRowOffset.assign(n, 0);
  for (int j = 1; j < n; ++j) plan.sendRowOffset[j] = plan.sendRowOffset[j - 1] + s.sendToRank[j - 1];
  plan.sendRows = n ? plan.sendRowOffset[n - 1] + s.sendToRank[n - 1] : 0;
  // expertBase[j * E + e]: rows before expert e's chunk inside rank j's part.
  std::vector<int64_t> expertBase(static_cast<size_t>(n) * E, 0);
  for (int j = 0; j < n; ++j) {
    int64_t acc = 0;
    for (int e = 0; e < E; ++e) expertBase[size_t(j) * E + e] = acc, acc += s.send[size_t(e) * n + j];
  }
  for (int e = 0; e < E; ++e) {
    int64_t scheduled = 0;
    for (int j = 0; j < n; ++j) scheduled += s.send[size_t(e) * n + j];
    if (scheduled != perExpert[e])
      throw std::invalid_argument("moe permute: the schedule sends " + std::to_string(scheduled) + " tokens of expert " +
                                  std::to_string(e) + " but topk routes " + std::to_string(perExpert[e]) +
                                  " (counts gathered from other routing?)");
  }
  std::vector<int> dest(E, 0);
  std::vector<int64_t> used(E, 0);
  plan.rowOf.assign(static_cast<size_t>(tokens) * k, -1);
  for (int64_t i = 0; i < tokens * k; ++i) {
    int32_t e = topk[i];
    if (e == -1) continue;
    while (used[e] == s.send[size_t(e) * n + dest[e]]) dest[e]++, used[e] = 0;
    int j = dest[e];
    plan.rowOf[i] = plan.sendRowOffset[j] + expertBase[size_t(j) * E + e] + used[e]++;
  }
  return plan;
}

void permuteRows(const void* x, size_t rowBytes, int64_t tokens, int k, const PermutePlan& plan, void* sendBuffer) {
  auto* out = static_cast<uint8_t*>(sendBuffer);
  const auto* in = static_cast<const uint8_t*>(x);
  for (int64_t i = 0; i < tokens * k; ++i)
    if (plan.rowOf[i] >= 0) std::memcpy(out + plan.rowOf[i] * rowBytes, in + (i / k) * rowBytes, rowBytes);
}

void permuteChoiceRows(const void* rows, size_t rowBytes, int64_t tokens, int k, const PermutePlan& plan,
                       void* sendBuffer) {
  auto* out = static_cast<uint8_t*>(sendBuffer);
  const auto* in = static_cast<const uint8_t*>(rows);
  for (int64_t i = 0; i < tokens * k; ++i)
    if (plan.rowOf[i] >= 0) std::memcpy(out + plan.rowOf[i] * rowBytes, in + i * rowBytes, rowBytes);
}

void gatherChoiceRows(const void* y, size_t rowBytes, int64_t tokens, int k, const PermutePlan& plan, void* out) {
  auto* o = static_cast<uint8_t*>(out);
  const auto* in = static_cast<const uint8_t*>(y);
  for (int64_t i = 0; i < tokens * k; ++i) {
    if (plan.rowOf[i] >= 0)
      std::memcpy(o + i * rowBytes, in + plan.rowOf[i] * rowBytes, rowBytes);
    else
      std::memset(o + i * rowBytes, 0, rowBytes);
  }
}

ReceiveLayout planReceive(const RankSchedule& s) {
  const int n = static_cast<int>(s.recvFromRank.size());
  const size_t q = s.localExperts.size();
  ReceiveLayout l;
  l.recvRowOffset.assign(n, 0);
  for (int i = 1; i < n; ++i) l.recvRowOffset[i] = l.recvRowOffset[i - 1] + s.recvFromRank[i - 1];
  l.recvRows = n ? l.recvRowOffset[n - 1] + s.recvFromRank[n - 1] : 0;
  l.expertRows.assign(q, 0);
  l.expertOffset.assign(q, 0);
  for (size_t e = 0; e < q; ++e)
    for (int i = 0; i < n; ++i) l.expertRows[e] += s.recv[e * n + i];
  for (size_t e = 1; e < q; ++e) l.expertOffset[e] = l.expertOffset[e - 1] + l.expertRows[e - 1];
  l.regroupTo.assign(static_cast<size_t>(l.recvRows), 0);
  std::vector<int64_t> filled(q, 0);
  // Source-major order: source i's chunk holds its rows for each local
  // expert in ascending order (the sender's expert order).
  for (int i = 0; i < n; ++i) {
    int64_t r = l.recvRowOffset[i];
    for (size_t e = 0; e < q; ++e)
      for (int64_t c = 0; c < s.recv[e * n + i]; ++c) l.regroupTo[r++] = l.expertOffset[e] + filled[e]++;
  }
  return l;
}

void regroupRows(const void* received, size_t rowBytes, const ReceiveLayout& l, void* expertMajor) {
  for (int64_t r = 0; r < l.recvRows; ++r)
    std::memcpy(static_cast<uint8_t*>(expertMajor) + l.regroupTo[r] * rowBytes,
                static_cast<const uint8_t*>(received) + r * rowBytes, rowBytes);
}

void ungroupRows(const void* expertMajor, size_t rowBytes, const ReceiveLayout& l, void* received) {
  for (int64_t r = 0; r < l.recvRows; ++r)
    std::memcpy(static_cast<uint8_t*>(received) + r * rowBytes,
                static_cast<const uint8_t*>(expertMajor) + l.regroupTo[r] * rowBytes, rowBytes);
}

void combineRows(const void* y, const float* weights, int64_t tokens, int k, int64_t hidden, ecclDataType_t type,
                 const PermutePlan& plan, void* out) {
  if (type != ecclFloat32 && type != ecclFloat16 && type != ecclBfloat16)
    throw std::invalid_argument("moe combine: data must be float32, float16 or bfloat16");
  const size_t es = coll::typeSize(type);
  std::vector<float> acc(type == ecclFloat32 ? 0 : static_cast<size_t>(hidden)), row(acc.size());
  std::vector<float> row2(type == ecclFloat32 ? 0 : static_cast<size_t>(hidden));
  for (int64_t t = 0; t < tokens; ++t) {
    // float32 accumulates straight into the output row (it stays in cache).
    float* a = type == ecclFloat32 ? static_cast<float*>(out) + t * hidden : acc.data();
    auto rowOf = [&](int s, std::vector<float>& widened) -> const float* {
      const void* src = static_cast<const uint8_t*>(y) + plan.rowOf[t * k + s] * hidden * es;
      if (type == ecclFloat32) return static_cast<const float*>(src);
      coll::widenToFloat(src, widened.data(), hidden, type);
      return widened.data();
    };
    // Rounded products added left to right from 0 (this file is built with
    // -ffp-contract=off; the CUDA kernel uses __fmul_rn/__fadd_rn): the same
    // bits on both. Two slots per pass over the row, the first pass starting
    // from 0 instead of reading a zeroed row.
    bool first = true;
    for (int s = 0; s < k;) {
      while (s < k && plan.rowOf[t * k + s] < 0) ++s;
      if (s == k) break;
      const float w0 = weights[t * k + s];
      const float* v0 = rowOf(s++, row);
      while (s < k && plan.rowOf[t * k + s] < 0) ++s;
      const float* base = first ? nullptr : a;
      if (s == k) {
        for (int64_t h = 0; h < hidden; ++h) a[h] = (base ? base[h] : 0.0f) + w0 * v0[h];
      } else {
        const float w1 = weights[t * k + s];
        const float* v1 = rowOf(s++, row2);
        for (int64_t h = 0; h < hidden; ++h) a[h] = ((base ? base[h] : 0.0f) + w0 * v0[h]) + w1 * v1[h];
      }
      first = false;
    }
    if (first) std::fill(a, a + hidden, 0.0f);
    if (type != ecclFloat32) coll::narrowFromFloat(acc.data(), static_cast<uint8_t*>(out) + t * hidden * es, hidden, type);
  }
}

}  // namespace eccl::moe
