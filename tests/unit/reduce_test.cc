#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "coll/reduce.h"
#include "common/crypto.h"

namespace eccl::coll {
namespace {

TEST(Half, KnownValuesRoundToNearestEven) {
  EXPECT_EQ(floatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(floatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(floatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00);               // rounds to infinity
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(floatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even (down)
  EXPECT_EQ(floatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie to even (up)
  EXPECT_TRUE(std::isnan(halfToFloat(floatToHalf(std::numeric_limits<float>::quiet_NaN()))));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;  // NaNs
    EXPECT_EQ(floatToHalf(halfToFloat(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
}

TEST(Bfloat16, KnownValuesRoundToNearestEven) {
  EXPECT_EQ(floatToBfloat16(1.0f), 0x3f80);
  EXPECT_EQ(floatToBfloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie to even
  EXPECT_EQ(floatToBfloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(bfloat16ToFloat(0xc040), -3.0f);
}

template <typename T>
double ref(double a, double b, ecclRedOp_t op) {
  switch (op) {
    case ecclSum: case ecclAvg: return a + b;
    case ecclProd: return a * b;
    case ecclMax: return std::max(a, b);
    default: return std::min(a, b);
  }
}

template <typename T>
void checkType(ecclDataType_t type) {
  std::mt19937 rng(7);
  const size_t n = 1031;  // odd, so vector tails run too
  for (int o = 0; o < ecclNumOps; ++o) {
    auto op = static_cast<ecclRedOp_t>(o);
    std::vector<T> a(n), b(n), out(n);
    for (size_t i = 0; i < n; ++i) {
      a[i] = static_cast<T>(static_cast<int>(rng() % 11) - (std::is_signed_v<T> ? 5 : 0));
      b[i] = static_cast<T>(static_cast<int>(rng() % 11) - (std::is_signed_v<T> ? 5 : 0));
    }
    reduce(out.data(), a.data(), b.data(), n, type, op);
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(static_cast<double>(out[i]), static_cast<T>(ref<T>(a[i], b[i], op)))
          << typeName(type) << " " << opName(op) << " at " << i;
    // In place (dst aliases a) gives the same answer.
    std::vector<T> inplace = a;
    reduce(inplace.data(), inplace.data(), b.data(), n, type, op);
    ASSERT_EQ(inplace, out);
  }
}

TEST(Reduce, EveryIntegerAndFloatTypeAndOpMatchesReference) {
  checkType<int8_t>(ecclInt8);
  checkType<uint8_t>(ecclUint8);
  checkType<int32_t>(ecclInt32);
  checkType<uint32_t>(ecclUint32);
  checkType<int64_t>(ecclInt64);
  checkType<uint64_t>(ecclUint64);
  checkType<float>(ecclFloat32);
  checkType<double>(ecclFloat64);
}

TEST(Reduce, HalfTypesComputeInFloatAndRoundOnce) {
  for (ecclDataType_t t : {ecclFloat16, ecclBfloat16}) {
    auto narrow = t == ecclFloat16 ? floatToHalf : floatToBfloat16;
    auto widen = t == ecclFloat16 ? halfToFloat : bfloat16ToFloat;
    std::vector<uint16_t> a(300), b(300), out(300);
    for (size_t i = 0; i < a.size(); ++i) a[i] = narrow(0.1f * i), b[i] = narrow(1.0f / (i + 1));
    for (int o = 0; o < ecclNumOps; ++o) {
      auto op = static_cast<ecclRedOp_t>(o);
      reduce(out.data(), a.data(), b.data(), a.size(), t, op);
      for (size_t i = 0; i < a.size(); ++i) {
        float want = static_cast<float>(ref<float>(widen(a[i]), widen(b[i]), op));
        ASSERT_EQ(out[i], narrow(want)) << typeName(t) << " " << opName(op) << " at " << i;
      }
    }
  }
}

TEST(Reduce, SignedOverflowWrapsLikeTwosComplement) {
  int8_t a = 127, b = 1, out;
  reduce(&out, &a, &b, 1, ecclInt8, ecclSum);
  EXPECT_EQ(out, -128);
}

TEST(Reduce, AverageDividesOnce) {
  std::vector<int32_t> v = {7, -7, 9};
  finishAverage(v.data(), v.size(), ecclInt32, 2);
  EXPECT_EQ(v, (std::vector<int32_t>{3, -3, 4}));
  float f = 1.0f;
  finishAverage(&f, 1, ecclFloat32, 3);
  EXPECT_EQ(f, 1.0f / 3.0f);
}

TEST(Reduce, InvalidTypeAndOpThrowUsageErrors) {
  int x = 0;
  EXPECT_THROW(reduce(&x, &x, &x, 1, static_cast<ecclDataType_t>(99), ecclSum), std::exception);
  EXPECT_THROW(reduce(&x, &x, &x, 1, ecclInt32, static_cast<ecclRedOp_t>(99)), std::exception);
}

TEST(Crc32c, MatchesTheStandardCheckValue) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
}

}  // namespace
}  // namespace eccl::coll
