// The CUDA kernels against the CPU reference, bit for bit: schedule,
// row map, permute, regroup/ungroup and combine (float32, float16,
// bfloat16). Runs on a machine with a CUDA device; elsewhere each test is
// skipped with the reason.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "coll/reduce.h"
#include "kernels/moe_cuda.h"
#include "kernels/moe_permute.h"

namespace eccl::moe {
namespace {

template <typename T>
struct DeviceBuffer {
  T* p = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) {
    if (cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)) != cudaSuccess) throw std::runtime_error("cudaMalloc");
  }
  DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DeviceBuffer() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
};

#define REQUIRE_GPU()                                               \
  do {                                                              \
    std::string why;                                                \
    if (!cuda::available(&why)) GTEST_SKIP() << "no GPU: " << why;  \
  } while (0)

struct Problem {
  int n = 6, E = 10, k = 2, T = 300, H = 40, rank = 2;
  std::vector<int64_t> tokens;
  std::vector<int32_t> replicas, topk;
  ScheduleInput input() const { return {n, E, tokens.data(), replicas.data()}; }
};

Problem makeProblem(uint64_t seed) {
  std::mt19937_64 rng(seed);
  Problem p;
  p.replicas.assign(size_t(p.E) * p.n, 0);
  for (int e = 0; e < p.E; ++e)
    for (int r = 0, c = 1 + int(rng() % 3); r < c; ++r) p.replicas[size_t(e) * p.n + rng() % p.n]++;
  p.topk.resize(size_t(p.T) * p.k);
  for (auto& t : p.topk) t = rng() % 7 == 0 ? -1 : int32_t(std::min<uint64_t>(rng() % 14, p.E - 1));
  p.tokens.assign(size_t(p.n) * p.E, 0);
  for (int32_t e : p.topk)
    if (e >= 0) p.tokens[size_t(p.rank) * p.E + e]++;
  for (int j = 0; j < p.n; ++j)
    if (j != p.rank)
      for (int e = 0; e < p.E; ++e) p.tokens[size_t(j) * p.E + e] = int64_t(rng() % 60);
  return p;
}

TEST(MoeCuda, ScheduleAndRowMapMatchTheCpuReference) {
  REQUIRE_GPU();
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    Problem p = makeProblem(seed);
    RankSchedule cpu = computeSchedule(p.input(), p.rank);
    DeviceBuffer<int64_t> dTokens(p.tokens), dSend(size_t(p.E) * p.n), dRecv(size_t(p.E) * p.n),
        dChunk(size_t(p.E) * p.n), dRowOf(p.topk.size());
    DeviceBuffer<int32_t> dReplicas(p.replicas), dTopk(p.topk);
    cuda::schedule(p.n, p.E, dTokens.p, dReplicas.p, p.rank, dSend.p, dRecv.p, nullptr);
    cuda::planPermute(dTopk.p, p.T, p.k, p.n, p.E, dSend.p, dChunk.p, dRowOf.p, nullptr);
    cuda::synchronize(nullptr);
    EXPECT_EQ(dSend.get(), cpu.send);
    auto recv = dRecv.get();
    for (size_t q = 0; q < cpu.localExperts.size(); ++q)
      for (int j = 0; j < p.n; ++j)
        EXPECT_EQ(recv[size_t(cpu.localExperts[q]) * p.n + j], cpu.recv[q * p.n + j]);
    PermutePlan plan = planPermute(p.topk.data(), p.T, p.k, cpu, p.E);
    EXPECT_EQ(dRowOf.get(), plan.rowOf);
  }
}

TEST(MoeCuda, PermuteRegroupAndCombineMatchTheCpuReferenceBitForBit) {
  REQUIRE_GPU();
  Problem p = makeProblem(11);
  RankSchedule s = computeSchedule(p.input(), p.rank);
  PermutePlan plan = planPermute(p.topk.data(), p.T, p.k, s, p.E);
  std::vector<float> x(size_t(p.T) * p.H);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i)) * 3.0f;
  const size_t rowBytes = p.H * sizeof(float);
  std::vector<float> cpuSend(size_t(plan.sendRows) * p.H);
  permuteRows(x.data(), rowBytes, p.T, p.k, plan, cpuSend.data());
  DeviceBuffer<float> dX(x), dSend(cpuSend.size());
  DeviceBuffer<int64_t> dRowOf(plan.rowOf);
  cuda::permuteRows(dX.p, rowBytes, p.T, p.k, dRowOf.p, dSend.p, nullptr);
  cuda::synchronize(nullptr);
  EXPECT_EQ(dSend.get(), cpuSend);

  ReceiveLayout layout = planReceive(s);
  std::vector<float> received(size_t(layout.recvRows) * p.H), cpuGrouped(received.size());
  for (size_t i = 0; i < received.size(); ++i) received[i] = float(i % 977) * 0.5f;
  regroupRows(received.data(), rowBytes, layout, cpuGrouped.data());
  DeviceBuffer<float> dRecv(received), dGrouped(received.size()), dBack(received.size());
  DeviceBuffer<int64_t> dRegroup(layout.regroupTo);
  cuda::regroupRows(dRecv.p, rowBytes, layout.recvRows, dRegroup.p, dGrouped.p, nullptr);
  cuda::ungroupRows(dGrouped.p, rowBytes, layout.recvRows, dRegroup.p, dBack.p, nullptr);
  cuda::synchronize(nullptr);
  EXPECT_EQ(dGrouped.get(), cpuGrouped);
  EXPECT_EQ(dBack.get(), received);

  std::vector<float> w(p.topk.size());
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.1f + float(i % 7) * 0.13f;
  DeviceBuffer<float> dW(w);
  for (ecclDataType_t type : {ecclFloat32, ecclFloat16, ecclBfloat16}) {
    const size_t es = coll::typeSize(type);
    std::vector<uint8_t> y(size_t(plan.sendRows) * p.H * es), cpuOut(size_t(p.T) * p.H * es);
    std::vector<float> wide(size_t(plan.sendRows) * p.H);
    for (size_t i = 0; i < wide.size(); ++i) wide[i] = std::cos(float(i)) * 2.0f;
    if (type == ecclFloat32) std::memcpy(y.data(), wide.data(), y.size());
    else coll::narrowFromFloat(wide.data(), y.data(), wide.size(), type);
    combineRows(y.data(), w.data(), p.T, p.k, p.H, type, plan, cpuOut.data());
    DeviceBuffer<uint8_t> dY(y), dOut(cpuOut.size());
    cuda::combineRows(dY.p, dW.p, p.T, p.k, p.H, type, dRowOf.p, dOut.p, nullptr);
    cuda::synchronize(nullptr);
    EXPECT_EQ(dOut.get(), cpuOut) << "type " << int(type);
  }
}

}  // namespace
}  // namespace eccl::moe
