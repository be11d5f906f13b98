#include "perf/dispatch_cuda.h"

#include <cinttypes>
#include <cstdio>
#include <string>

#ifdef ECCL_PERF_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <vector>

#include "kernels/moe_cuda.h"
#include "kernels/moe_permute.h"
#include "kernels/moe_schedule.h"
#endif

namespace eccl::perf {

#ifndef ECCL_PERF_CUDA
void dispatchCudaSection(bool json, double) {
  if (json)
    printf("{\"section\": \"cuda\", \"skipped\": \"built without CUDA\"}\n");
  else
    printf("# CUDA permute/combine: skipped (built without CUDA)\n");
}
#else
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

template <typename T>
T* deviceCopy(const std::vector<T>& host) {
  T* p = nullptr;
  check(cudaMalloc(&p, std::max<size_t>(host.size(), 1) * sizeof(T)), "cudaMalloc");
  check(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  return p;
}

// Median of `runs` timings of `body` on the default stream, in ms.
double medianMs(int runs, const std::function<void()>& body) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  body();  // warm
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    cudaEventRecord(a);
    body();
    cudaEventRecord(b);
    check(cudaEventSynchronize(b), "timed kernels");
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

void dispatchCudaSection(bool json, double hbmGBs) {
  std::string why;
  if (!moe::cuda::available(&why)) {
    if (json)
      printf("{\"section\": \"cuda\", \"skipped\": \"%s\"}\n", why.c_str());
    else
      printf("# CUDA permute/combine: skipped (%s)\n", why.c_str());
    return;
  }
  // The same routing as the CPU section, larger: 64 Ki tokens x top-2, hidden 2048 float32.
  const int n = 8, E = 64, k = 2;
  const int64_t T = 65536, hidden = 2048;
  const size_t rowBytes = hidden * sizeof(float);
  std::vector<int32_t> topk(static_cast<size_t>(T) * k);
  for (int64_t t = 0; t < T; ++t)
    for (int s = 0; s < k; ++s) topk[size_t(t) * k + s] = static_cast<int32_t>((t * 7 + s * 13 + (t % 5) * (t % 3)) % E);
  std::vector<int64_t> tokens(static_cast<size_t>(n) * E, 0);
  for (int32_t e : topk) tokens[e]++;
  for (int j = 1; j < n; ++j) std::copy(tokens.begin(), tokens.begin() + E, tokens.begin() + size_t(j) * E);
  std::vector<int32_t> replicas(static_cast<size_t>(E) * n, 0);
  for (int e = 0; e < E; ++e) replicas[size_t(e) * n + e % n] = 1 + (e < 4);
  moe::ScheduleInput in{n, E, tokens.data(), replicas.data()};
  moe::RankSchedule s = moe::computeSchedule(in, 0);
  moe::PermutePlan plan = moe::planPermute(topk.data(), T, k, s, E);
  const size_t sendBytes = static_cast<size_t>(plan.sendRows) * rowBytes;
  int64_t* rowOf = deviceCopy(plan.rowOf);
  float* x = deviceCopy(std::vector<float>(static_cast<size_t>(T) * hidden, 1.5f));
  float* weights = deviceCopy(std::vector<float>(static_cast<size_t>(T) * k, 0.5f));
  void *send = nullptr, *copy = nullptr, *out = nullptr;
  check(cudaMalloc(&send, sendBytes), "cudaMalloc");
  check(cudaMalloc(&copy, sendBytes), "cudaMalloc");
  check(cudaMalloc(&out, static_cast<size_t>(T) * rowBytes), "cudaMalloc");
  double copyMs = medianMs(9, [&] { check(cudaMemcpyAsync(copy, send, sendBytes, cudaMemcpyDeviceToDevice), "copy"); });
  double permuteMs = medianMs(9, [&] { moe::cuda::permuteRows(x, rowBytes, T, k, rowOf, send, nullptr); });
  double combineMs =
      medianMs(9, [&] { moe::cuda::combineRows(send, weights, T, k, hidden, ecclFloat32, rowOf, out, nullptr); });
  const double bytes = static_cast<double>(sendBytes);
  double copyGBs = 2 * bytes / copyMs / 1e6, permuteGBs = 2 * bytes / permuteMs / 1e6;
  double combineGBs = (bytes + double(T) * rowBytes) / combineMs / 1e6;
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  if (json) {
    printf("{\"section\": \"cuda\", \"device\": \"%s\", \"copy_gbs\": %.1f, \"permute_gbs\": %.1f, \"combine_gbs\": %.1f, "
           "\"permute_ratio\": %.3f, \"combine_ratio\": %.3f, \"hbm_gbs\": %.0f}\n",
           prop.name, copyGBs, permuteGBs, combineGBs, permuteGBs / copyGBs, combineGBs / copyGBs, hbmGBs);
  } else {
    printf("# CUDA permute/combine on %s: %" PRId64 " tokens x top-%d, hidden %" PRId64 " float32 (%.0f MB moved)\n",
           prop.name, T, k, hidden, bytes / 1e6);
    printf("#  %-10s %10s %12s %10s %10s\n", "kernel", "time (ms)", "GB/s (r+w)", "vs D2D", "vs HBM");
    printf("   %-10s %10.3f %12.1f %10s %10.2f\n", "D2D copy", copyMs, copyGBs, "1.00", copyGBs / hbmGBs);
    printf("   %-10s %10.3f %12.1f %10.2f %10.2f\n", "permute", permuteMs, permuteGBs, permuteGBs / copyGBs,
           permuteGBs / hbmGBs);
    printf("   %-10s %10.3f %12.1f %10.2f %10.2f\n", "combine", combineMs, combineGBs, combineGBs / copyGBs,
           combineGBs / hbmGBs);
  }
  cudaFree(rowOf);
  cudaFree(x);
  cudaFree(weights);
  cudaFree(send);
  cudaFree(copy);
  cudaFree(out);
}
#endif

}  // namespace eccl::perf
