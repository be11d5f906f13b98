// CUDA kernels of the MoE dispatcher; contracts in moe_cuda.h, CPU
// reference in moe_schedule.cc and moe_permute.cc.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cub/block/block_scan.cuh>
#include <stdexcept>
#include <string>

#include "kernels/moe_cuda.h"

namespace eccl::moe::cuda {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("moe cuda: ") + what + ": " + cudaGetErrorString(e));
}

cudaStream_t asStream(void* s) { return static_cast<cudaStream_t>(s); }

// One expert's numbers for rank j, recomputed where needed: O(N) per pass.
struct Split {
  int64_t quota, extra;
  __device__ void capLocal(const int64_t* tokens, const int32_t* replicas, int n, int E, int e, int j,
                           int64_t before, int64_t* cap, int64_t* local) const {
    int64_t r = replicas[static_cast<size_t>(e) * n + j];
    int64_t c = r * quota + min(max(extra - before, int64_t(0)), r);
    int64_t t = tokens[static_cast<size_t>(j) * E + e];
    *cap = c;
    *local = min(t, c);
  }
};

__global__ void scheduleKernel(int n, int E, const int64_t* tokens, const int32_t* replicas, int rank, int64_t* send,
                               int64_t* recv) {
  int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= E) return;
  int64_t total = 0, reps = 0;
  for (int j = 0; j < n; ++j) total += tokens[static_cast<size_t>(j) * E + e], reps += replicas[static_cast<size_t>(e) * n + j];
  Split sp{reps ? total / reps : 0, reps ? total % reps : 0};
  int64_t* row = send + static_cast<size_t>(e) * n;
  int64_t* in = recv + static_cast<size_t>(e) * n;
  // Where this rank's overflow and residual intervals start.
  int64_t overStart = 0, residStart = 0, myOver = 0, myResid = 0, before = 0;
  for (int j = 0; j < n; ++j) {
    int64_t cap, local;
    sp.capLocal(tokens, replicas, n, E, e, j, before, &cap, &local);
    before += replicas[static_cast<size_t>(e) * n + j];
    int64_t over = tokens[static_cast<size_t>(j) * E + e] - local, resid = cap - local;
    if (j < rank) overStart += over, residStart += resid;
    if (j == rank) myOver = over, myResid = resid, row[j] = local, in[j] = replicas[static_cast<size_t>(e) * n + rank] ? local : 0;
    if (j != rank) row[j] = 0, in[j] = 0;
  }
  const bool hosted = replicas[static_cast<size_t>(e) * n + rank] > 0;
  int64_t overPos = 0, residPos = 0;
  before = 0;
  for (int j = 0; j < n; ++j) {
    int64_t cap, local;
    sp.capLocal(tokens, replicas, n, E, e, j, before, &cap, &local);
    before += replicas[static_cast<size_t>(e) * n + j];
    int64_t over = tokens[static_cast<size_t>(j) * E + e] - local, resid = cap - local;
    // As a sender: my overflow against receiver j's residual.
    int64_t lo = max(residPos, overStart), hi = min(residPos + resid, overStart + myOver);
    if (hi > lo) row[j] += hi - lo;
    // As a receiver: my residual against sender j's overflow.
    if (hosted) {
      lo = max(overPos, residStart), hi = min(overPos + over, residStart + myResid);
      if (hi > lo) in[j] += hi - lo;
    }
    residPos += resid;
    overPos += over;
  }
}

// chunkBase[e * N + j] = first row of (destination j, expert e) in the send
// buffer: rank-major, then expert.
__global__ void chunkBaseKernel(int n, int E, const int64_t* send, int64_t* chunkBase) {
  // One block; thread j sums its column, then a serial scan over ranks.
  extern __shared__ int64_t toRank[];
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    int64_t acc = 0;
    for (int e = 0; e < E; ++e) chunkBase[static_cast<size_t>(e) * n + j] = acc, acc += send[static_cast<size_t>(e) * n + j];
    toRank[j] = acc;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t acc = 0;
    for (int j = 0; j < n; ++j) {
      int64_t t = toRank[j];
      toRank[j] = acc;
      acc += t;
    }
  }
  __syncthreads();
  for (int j = threadIdx.x; j < n; j += blockDim.x)
    for (int e = 0; e < E; ++e) chunkBase[static_cast<size_t>(e) * n + j] += toRank[j];
}

constexpr int kScanThreads = 256;

// One block per expert: the choices routed to it, in token order, take
// consecutive positions; position p goes to the destination whose
// cumulative send count covers it.
__global__ void rowOfKernel(const int32_t* topk, int64_t entries, int n, const int64_t* send, const int64_t* chunkBase,
                            int64_t* rowOf) {
  using Scan = cub::BlockScan<int64_t, kScanThreads>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ int64_t carry;
  const int e = blockIdx.x;
  const int64_t* row = send + static_cast<size_t>(e) * n;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int64_t base = 0; base < entries; base += kScanThreads) {
    int64_t i = base + threadIdx.x;
    int64_t mine = (i < entries && topk[i] == e) ? 1 : 0, pos, total;
    Scan(temp).ExclusiveSum(mine, pos, total);
    if (mine) {
      int64_t p = carry + pos;
      int j = 0;
      while (j < n && p >= row[j]) p -= row[j], ++j;  // the destination whose chunk holds p
      // -2: the schedule has fewer tokens of e than topk routes (inputs
      // from different routings); the CPU planPermute rejects that.
      rowOf[i] = j < n ? chunkBase[static_cast<size_t>(e) * n + j] + p : -2;
    }
    __syncthreads();
    if (threadIdx.x == 0) carry += total;
    __syncthreads();
  }
}

__global__ void noChoiceKernel(const int32_t* topk, int64_t entries, int64_t* rowOf) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < entries && topk[i] < 0) rowOf[i] = -1;
}

// Row copies: one block per row, 16-byte words when the row allows it.
__global__ void copyRowsKernel(const uint8_t* src, size_t rowBytes, int64_t rows, const int64_t* srcRowOf,
                               const int64_t* dstRowOf, int k, uint8_t* dst) {
  int64_t r = blockIdx.x;
  if (r >= rows) return;
  int64_t from = srcRowOf ? srcRowOf[r] : r / k;  // permute: source is token r / k
  int64_t to = dstRowOf[r];
  if (from < 0 || to < 0) return;
  const uint8_t* s = src + from * rowBytes;
  uint8_t* d = dst + to * rowBytes;
  if (rowBytes % 16 == 0 && reinterpret_cast<uintptr_t>(s) % 16 == 0 && reinterpret_cast<uintptr_t>(d) % 16 == 0) {
    for (size_t w = threadIdx.x; w < rowBytes / 16; w += blockDim.x)
      reinterpret_cast<uint4*>(d)[w] = reinterpret_cast<const uint4*>(s)[w];
  } else {
    for (size_t b = threadIdx.x; b < rowBytes; b += blockDim.x) d[b] = s[b];
  }
}

__global__ void ungroupKernel(const uint8_t* src, size_t rowBytes, int64_t rows, const int64_t* regroupTo, uint8_t* dst) {
  int64_t r = blockIdx.x;
  if (r >= rows) return;
  const uint8_t* s = src + regroupTo[r] * rowBytes;
  uint8_t* d = dst + r * rowBytes;
  for (size_t b = threadIdx.x; b < rowBytes; b += blockDim.x) d[b] = s[b];
}

template <typename T>
__device__ float toFloat(T v);
template <>
__device__ float toFloat<float>(float v) { return v; }
template <>
__device__ float toFloat<__half>(__half v) { return __half2float(v); }
template <>
__device__ float toFloat<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ T fromFloat(float v);
template <>
__device__ float fromFloat<float>(float v) { return v; }
template <>
__device__ __half fromFloat<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename T>
__global__ void combineKernel(const T* y, const float* w, int64_t tokens, int k, int64_t hidden, const int64_t* rowOf,
                              T* out) {
  int64_t t = blockIdx.y;
  for (int64_t h = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; h < hidden;
       h += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float acc = 0.0f;
    for (int s = 0; s < k; ++s) {
      int64_t r = rowOf[t * k + s];
      if (r < 0) continue;
      acc = __fadd_rn(acc, __fmul_rn(w[t * k + s], toFloat<T>(y[r * hidden + h])));
    }
    out[t * hidden + h] = fromFloat<T>(acc);
  }
}

unsigned blocksFor(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace

bool available(std::string* why) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
    return false;
  }
  if (count == 0) {
    *why = "no CUDA device on this machine";
    return false;
  }
  return true;
}

void schedule(int n, int E, const int64_t* tokens, const int32_t* replicas, int rank, int64_t* send, int64_t* recv,
              void* stream) {
  scheduleKernel<<<blocksFor(E, 128), 128, 0, asStream(stream)>>>(n, E, tokens, replicas, rank, send, recv);
  check(cudaGetLastError(), "schedule kernel launch");
}

void planPermute(const int32_t* topk, int64_t tokens, int k, int n, int E, const int64_t* send, int64_t* chunkBase,
                 int64_t* rowOf, void* stream) {
  const int64_t entries = tokens * k;
  chunkBaseKernel<<<1, 256, n * sizeof(int64_t), asStream(stream)>>>(n, E, send, chunkBase);
  check(cudaGetLastError(), "chunk base kernel launch");
  if (entries == 0) return;
  noChoiceKernel<<<blocksFor(entries, 256), 256, 0, asStream(stream)>>>(topk, entries, rowOf);
  rowOfKernel<<<E, kScanThreads, 0, asStream(stream)>>>(topk, entries, n, send, chunkBase, rowOf);
  check(cudaGetLastError(), "row map kernel launch");
}

void permuteRows(const void* x, size_t rowBytes, int64_t tokens, int k, const int64_t* rowOf, void* sendBuffer,
                 void* stream) {
  if (tokens * k == 0) return;
  copyRowsKernel<<<static_cast<unsigned>(tokens * k), 128, 0, asStream(stream)>>>(
      static_cast<const uint8_t*>(x), rowBytes, tokens * k, nullptr, rowOf, k, static_cast<uint8_t*>(sendBuffer));
  check(cudaGetLastError(), "permute kernel launch");
}

void regroupRows(const void* received, size_t rowBytes, int64_t rows, const int64_t* regroupTo, void* expertMajor,
                 void* stream) {
  if (rows == 0) return;
  copyRowsKernel<<<static_cast<unsigned>(rows), 128, 0, asStream(stream)>>>(
      static_cast<const uint8_t*>(received), rowBytes, rows, /*identity source*/ nullptr, regroupTo, 1,
      static_cast<uint8_t*>(expertMajor));
  check(cudaGetLastError(), "regroup kernel launch");
}

void ungroupRows(const void* expertMajor, size_t rowBytes, int64_t rows, const int64_t* regroupTo, void* received,
                 void* stream) {
  if (rows == 0) return;
  ungroupKernel<<<static_cast<unsigned>(rows), 128, 0, asStream(stream)>>>(
      static_cast<const uint8_t*>(expertMajor), rowBytes, rows, regroupTo, static_cast<uint8_t*>(received));
  check(cudaGetLastError(), "ungroup kernel launch");
}

void combineRows(const void* y, const float* weights, int64_t tokens, int k, int64_t hidden, ecclDataType_t type,
                 const int64_t* rowOf, void* out, void* stream) {
  if (tokens == 0 || hidden == 0) return;
  dim3 grid(std::min<unsigned>(blocksFor(hidden, 256), 64), static_cast<unsigned>(tokens));
  cudaStream_t s = asStream(stream);
  switch (type) {
    case ecclFloat32:
      combineKernel<float><<<grid, 256, 0, s>>>(static_cast<const float*>(y), weights, tokens, k, hidden, rowOf,
                                                static_cast<float*>(out));
      break;
    case ecclFloat16:
      combineKernel<__half><<<grid, 256, 0, s>>>(static_cast<const __half*>(y), weights, tokens, k, hidden, rowOf,
                                                 static_cast<__half*>(out));
      break;
    case ecclBfloat16:
      combineKernel<__nv_bfloat16><<<grid, 256, 0, s>>>(static_cast<const __nv_bfloat16*>(y), weights, tokens, k,
                                                        hidden, rowOf, static_cast<__nv_bfloat16*>(out));
      break;
    default:
      throw std::invalid_argument("moe combine: data must be float32, float16 or bfloat16");
  }
  check(cudaGetLastError(), "combine kernel launch");
}

void synchronize(void* stream) { check(cudaStreamSynchronize(asStream(stream)), "stream synchronize"); }

}  // namespace eccl::moe::cuda
