#include "coll/reduce.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "common/error.h"

namespace eccl::coll {

bool isHalfType(ecclDataType_t t) { return t == ecclFloat16 || t == ecclBfloat16; }

float halfToFloat(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { ++e; mant <<= 1; } while (!(mant & 0x400u));
      bits = sign | ((127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (absx < 0x38800000u) {  // subnormal or zero in half
    float a;
    std::memcpy(&a, &absx, 4);
    // a * 2^24 rounded to nearest even gives the subnormal mantissa.
    uint32_t m = static_cast<uint32_t>(std::nearbyint(a * 16777216.0f));
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t mant = absx & 0x7fffffu;
  uint32_t exp = (absx >> 23) - 127 + 15;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float bfloat16ToFloat(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToBfloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

void widenToFloat(const void* in, float* out, size_t n, ecclDataType_t t) {
  if (t == ecclFloat16) {
    auto* p = static_cast<const uint16_t*>(in);
    for (size_t i = 0; i < n; ++i) out[i] = halfToFloat(p[i]);
    return;
  }
  // bfloat16 is float's top half: a shift the compiler vectorises.
  const uint16_t* __restrict p = static_cast<const uint16_t*>(in);
  float* __restrict f = out;
  for (size_t i = 0; i < n; ++i) f[i] = std::bit_cast<float>(static_cast<uint32_t>(p[i]) << 16);
}

void narrowFromFloat(const float* in, void* out, size_t n, ecclDataType_t t) {
  if (t == ecclFloat16) {
    auto* p = static_cast<uint16_t*>(out);
    for (size_t i = 0; i < n; ++i) p[i] = floatToHalf(in[i]);
    return;
  }
  // floatToBfloat16 without branches (round to nearest even, NaN kept
  // quiet), so the loop vectorises; the same bits.
  const float* __restrict f = in;
  uint16_t* __restrict p = static_cast<uint16_t*>(out);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t x = std::bit_cast<uint32_t>(f[i]);
    const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    const uint32_t quiet = (x >> 16) | 0x40u;
    p[i] = static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
  }
}

namespace {

// Plain loops over restrict pointers: GCC and clang vectorise these at -O2
// and above (checked with -fopt-info-vec; see docs/performance.md). In-place
// calls alias dst with a, which is fine element-wise but forbids restrict, so
// aliasing calls take a separate instantiation.
template <typename T, typename F>
void apply(T* dst, const T* a, const T* b, size_t n, F f) {
  if (dst == a || dst == b) {
    for (size_t i = 0; i < n; ++i) dst[i] = f(a[i], b[i]);
  } else {
    T* __restrict d = dst;
    const T* __restrict x = a;
    const T* __restrict y = b;
    for (size_t i = 0; i < n; ++i) d[i] = f(x[i], y[i]);
  }
}

template <typename T>
void reduceTyped(void* dst, const void* a, const void* b, size_t n, ecclRedOp_t op) {
  auto* d = static_cast<T*>(dst);
  auto* x = static_cast<const T*>(a);
  auto* y = static_cast<const T*>(b);
  switch (op) {
    case ecclSum: case ecclAvg: apply(d, x, y, n, [](T p, T q) { return static_cast<T>(p + q); }); break;
    case ecclProd: apply(d, x, y, n, [](T p, T q) { return static_cast<T>(p * q); }); break;
    case ecclMax: apply(d, x, y, n, [](T p, T q) { return p > q ? p : q; }); break;
    case ecclMin: apply(d, x, y, n, [](T p, T q) { return p < q ? p : q; }); break;
    default: fail(ecclInvalidArgument, "invalid reduction op {}", static_cast<int>(op));
  }
}

template <float (*Widen)(uint16_t), uint16_t (*Narrow)(float)>
void reduceHalf(void* dst, const void* a, const void* b, size_t n, ecclRedOp_t op) {
  auto* d = static_cast<uint16_t*>(dst);
  auto* x = static_cast<const uint16_t*>(a);
  auto* y = static_cast<const uint16_t*>(b);
  float buf[256], other[256];
  for (size_t base = 0; base < n; base += 256) {
    size_t m = std::min<size_t>(256, n - base);
    for (size_t i = 0; i < m; ++i) buf[i] = Widen(x[base + i]), other[i] = Widen(y[base + i]);
    reduceTyped<float>(buf, buf, other, m, op);
    for (size_t i = 0; i < m; ++i) d[base + i] = Narrow(buf[i]);
  }
}

// Signed overflow in sum/prod wraps like NCCL's; do it in unsigned space to
// keep UBSan quiet and the result defined.
template <typename S>
void reduceSigned(void* dst, const void* a, const void* b, size_t n, ecclRedOp_t op) {
  using U = std::make_unsigned_t<S>;
  if (op == ecclMax || op == ecclMin) return reduceTyped<S>(dst, a, b, n, op);
  reduceTyped<U>(dst, a, b, n, op);
}

}  // namespace

void reduce(void* dst, const void* a, const void* b, size_t n, ecclDataType_t t, ecclRedOp_t op) {
  if (op < 0 || op >= ecclNumOps) fail(ecclInvalidArgument, "invalid reduction op {}", static_cast<int>(op));
  switch (t) {
    case ecclInt8: return reduceSigned<int8_t>(dst, a, b, n, op);
    case ecclUint8: return reduceTyped<uint8_t>(dst, a, b, n, op);
    case ecclInt32: return reduceSigned<int32_t>(dst, a, b, n, op);
    case ecclUint32: return reduceTyped<uint32_t>(dst, a, b, n, op);
    case ecclInt64: return reduceSigned<int64_t>(dst, a, b, n, op);
    case ecclUint64: return reduceTyped<uint64_t>(dst, a, b, n, op);
    case ecclFloat32: return reduceTyped<float>(dst, a, b, n, op);
    case ecclFloat64: return reduceTyped<double>(dst, a, b, n, op);
    case ecclFloat16: return reduceHalf<halfToFloat, floatToHalf>(dst, a, b, n, op);
    case ecclBfloat16: return reduceHalf<bfloat16ToFloat, floatToBfloat16>(dst, a, b, n, op);
    default: fail(ecclInvalidArgument, "invalid data type {}", static_cast<int>(t));
  }
}

namespace {
template <typename T>
void divide(void* buf, size_t n, int nranks) {
  auto* p = static_cast<T*>(buf);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<T>(p[i] / static_cast<T>(nranks));
}
}  // namespace

void finishAverage(void* buf, size_t n, ecclDataType_t t, int nranks) {
  switch (t) {
    case ecclInt8: return divide<int8_t>(buf, n, nranks);
    case ecclUint8: return divide<uint8_t>(buf, n, nranks);
    case ecclInt32: return divide<int32_t>(buf, n, nranks);
    case ecclUint32: return divide<uint32_t>(buf, n, nranks);
    case ecclInt64: return divide<int64_t>(buf, n, nranks);
    case ecclUint64: return divide<uint64_t>(buf, n, nranks);
    case ecclFloat32: return divide<float>(buf, n, nranks);
    case ecclFloat64: return divide<double>(buf, n, nranks);
    default: fail(ecclInternalError, "average of {} must be finished in float32", typeName(t));
  }
}

}  // namespace eccl::coll
