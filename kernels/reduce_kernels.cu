// Device reductions that match src/coll/reduce.cc bit for bit: the
// conversions below are that file's, line for line, as device code (the
// CUDA intrinsics round the same way but treat NaN payloads differently).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/reduce_cuda.h"

namespace eccl::kernels::cuda {
namespace {

cudaStream_t asStream(void* s) { return static_cast<cudaStream_t>(s); }

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

__device__ float halfToFloat(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {
      int e = -1;
      do { ++e; mant <<= 1; } while (!(mant & 0x400u));
      bits = sign | ((127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return __uint_as_float(bits);
}

__device__ uint16_t floatToHalf(float f) {
  uint32_t x = __float_as_uint(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (absx < 0x38800000u) {
    float a = __uint_as_float(absx);
    uint32_t m = static_cast<uint32_t>(rintf(__fmul_rn(a, 16777216.0f)));
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t mant = absx & 0x7fffffu;
  uint32_t exp = (absx >> 23) - 127 + 15;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

__device__ float bfloat16ToFloat(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }

__device__ uint16_t floatToBfloat16(float f) {
  uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);
  x += 0x7fffu + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

// One rounding per operation, as on the host (no contraction into FMA).
template <typename T>
__device__ T combine(T p, T q, ecclRedOp_t op) {
  if constexpr (std::is_same_v<T, float>) {
    if (op == ecclProd) return __fmul_rn(p, q);
    if (op == ecclSum || op == ecclAvg) return __fadd_rn(p, q);
  } else if constexpr (std::is_same_v<T, double>) {
    if (op == ecclProd) return __dmul_rn(p, q);
    if (op == ecclSum || op == ecclAvg) return __dadd_rn(p, q);
  } else {
    if (op == ecclProd) return static_cast<T>(p * q);
    if (op == ecclSum || op == ecclAvg) return static_cast<T>(p + q);
  }
  if (op == ecclMax) return p > q ? p : q;
  return p < q ? p : q;
}

template <typename T>
__global__ void reduceKernel(T* dst, const T* a, const T* b, size_t n, ecclRedOp_t op) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = combine<T>(a[i], b[i], op);
}

// Signed sum and product wrap: computed in the unsigned type, as the host does.
template <typename S>
__global__ void reduceSignedKernel(S* dst, const S* a, const S* b, size_t n, ecclRedOp_t op) {
  using U = std::make_unsigned_t<S>;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    if (op == ecclMax || op == ecclMin)
      dst[i] = combine<S>(a[i], b[i], op);
    else
      dst[i] = static_cast<S>(combine<U>(static_cast<U>(a[i]), static_cast<U>(b[i]), op));
  }
}

template <bool Bf16>
__global__ void reduceHalfKernel(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t n, ecclRedOp_t op) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float x = Bf16 ? bfloat16ToFloat(a[i]) : halfToFloat(a[i]);
    float y = Bf16 ? bfloat16ToFloat(b[i]) : halfToFloat(b[i]);
    float r = combine<float>(x, y, op);
    dst[i] = Bf16 ? floatToBfloat16(r) : floatToHalf(r);
  }
}

template <typename T>
__global__ void divideKernel(T* buf, size_t n, int nranks) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    if constexpr (std::is_same_v<T, float>)
      buf[i] = __fdiv_rn(buf[i], static_cast<float>(nranks));
    else if constexpr (std::is_same_v<T, double>)
      buf[i] = __ddiv_rn(buf[i], static_cast<double>(nranks));
    else
      buf[i] = static_cast<T>(buf[i] / static_cast<T>(nranks));
  }
}

template <bool Bf16>
__global__ void widenKernel(const uint16_t* in, float* out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = Bf16 ? bfloat16ToFloat(in[i]) : halfToFloat(in[i]);
}

template <bool Bf16>
__global__ void narrowKernel(const float* in, uint16_t* out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = Bf16 ? floatToBfloat16(in[i]) : floatToHalf(in[i]);
}

constexpr int kThreads = 256;
unsigned blocksFor(size_t n) { return static_cast<unsigned>(std::min<size_t>((n + kThreads - 1) / kThreads, 4096)); }

template <typename T>
void launch(void* dst, const void* a, const void* b, size_t n, ecclRedOp_t op, cudaStream_t s) {
  reduceKernel<T><<<blocksFor(n), kThreads, 0, s>>>(static_cast<T*>(dst), static_cast<const T*>(a),
                                                     static_cast<const T*>(b), n, op);
}

template <typename S>
void launchSigned(void* dst, const void* a, const void* b, size_t n, ecclRedOp_t op, cudaStream_t s) {
  reduceSignedKernel<S><<<blocksFor(n), kThreads, 0, s>>>(static_cast<S*>(dst), static_cast<const S*>(a),
                                                           static_cast<const S*>(b), n, op);
}

template <typename T>
void launchDivide(void* buf, size_t n, int nranks, cudaStream_t s) {
  divideKernel<T><<<blocksFor(n), kThreads, 0, s>>>(static_cast<T*>(buf), n, nranks);
}

}  // namespace

void reduce(void* dst, const void* a, const void* b, size_t n, ecclDataType_t type, ecclRedOp_t op, void* stream) {
  if (op < 0 || op >= ecclNumOps) throw std::invalid_argument("invalid reduction op " + std::to_string(op));
  if (n == 0) return;
  cudaStream_t s = asStream(stream);
  auto* d = static_cast<uint16_t*>(dst);
  auto* x = static_cast<const uint16_t*>(a);
  auto* y = static_cast<const uint16_t*>(b);
  switch (type) {
    case ecclInt8: launchSigned<int8_t>(dst, a, b, n, op, s); break;
    case ecclUint8: launch<uint8_t>(dst, a, b, n, op, s); break;
    case ecclInt32: launchSigned<int32_t>(dst, a, b, n, op, s); break;
    case ecclUint32: launch<uint32_t>(dst, a, b, n, op, s); break;
    case ecclInt64: launchSigned<int64_t>(dst, a, b, n, op, s); break;
    case ecclUint64: launch<uint64_t>(dst, a, b, n, op, s); break;
    case ecclFloat32: launch<float>(dst, a, b, n, op, s); break;
    case ecclFloat64: launch<double>(dst, a, b, n, op, s); break;
    case ecclFloat16: reduceHalfKernel<false><<<blocksFor(n), kThreads, 0, s>>>(d, x, y, n, op); break;
    case ecclBfloat16: reduceHalfKernel<true><<<blocksFor(n), kThreads, 0, s>>>(d, x, y, n, op); break;
    default: throw std::invalid_argument("invalid data type " + std::to_string(type));
  }
  check(cudaGetLastError(), "reduce kernel launch");
}

void finishAverage(void* buf, size_t n, ecclDataType_t type, int nranks, void* stream) {
  if (n == 0) return;
  cudaStream_t s = asStream(stream);
  switch (type) {
    case ecclInt8: launchDivide<int8_t>(buf, n, nranks, s); break;
    case ecclUint8: launchDivide<uint8_t>(buf, n, nranks, s); break;
    case ecclInt32: launchDivide<int32_t>(buf, n, nranks, s); break;
    case ecclUint32: launchDivide<uint32_t>(buf, n, nranks, s); break;
    case ecclInt64: launchDivide<int64_t>(buf, n, nranks, s); break;
    case ecclUint64: launchDivide<uint64_t>(buf, n, nranks, s); break;
    case ecclFloat32: launchDivide<float>(buf, n, nranks, s); break;
    case ecclFloat64: launchDivide<double>(buf, n, nranks, s); break;
    default: throw std::invalid_argument("the average of a half type is finished in float32");
  }
  check(cudaGetLastError(), "average kernel launch");
}

void widenToFloat(const void* in, float* out, size_t n, ecclDataType_t halfType, void* stream) {
  if (n == 0) return;
  auto* p = static_cast<const uint16_t*>(in);
  if (halfType == ecclBfloat16)
    widenKernel<true><<<blocksFor(n), kThreads, 0, asStream(stream)>>>(p, out, n);
  else
    widenKernel<false><<<blocksFor(n), kThreads, 0, asStream(stream)>>>(p, out, n);
  check(cudaGetLastError(), "widen kernel launch");
}

void narrowFromFloat(const float* in, void* out, size_t n, ecclDataType_t halfType, void* stream) {
  if (n == 0) return;
  auto* p = static_cast<uint16_t*>(out);
  if (halfType == ecclBfloat16)
    narrowKernel<true><<<blocksFor(n), kThreads, 0, asStream(stream)>>>(in, p, n);
  else
    narrowKernel<false><<<blocksFor(n), kThreads, 0, asStream(stream)>>>(in, p, n);
  check(cudaGetLastError(), "narrow kernel launch");
}

void synchronize(void* stream) { check(cudaStreamSynchronize(asStream(stream)), "device reduction"); }

}  // namespace eccl::kernels::cuda
