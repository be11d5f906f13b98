// The device reductions against the CPU reference, bit for bit, for every
// type and op, on inputs that include the awkward values (NaN, infinities,
// subnormals, signed overflow, the extremes of each integer type), in place
// and out of place, plus the average's division and the half-type
// conversions. Runs on a machine with a CUDA device; elsewhere each test
// is skipped with the reason.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "coll/reduce.h"
#include "kernels/moe_cuda.h"
#include "kernels/reduce_cuda.h"

namespace eccl::kernels::cuda {
namespace {

#define REQUIRE_GPU()                                                   \
  do {                                                                  \
    std::string why;                                                    \
    if (!moe::cuda::available(&why)) GTEST_SKIP() << "no GPU: " << why; \
  } while (0)

struct Device {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Device(const std::vector<uint8_t>& host) : bytes(host.size()) {
    if (cudaMalloc(&p, std::max<size_t>(bytes, 1)) != cudaSuccess) throw std::runtime_error("cudaMalloc");
    cudaMemcpy(p, host.data(), bytes, cudaMemcpyHostToDevice);
  }
  ~Device() { cudaFree(p); }
  std::vector<uint8_t> get() const {
    std::vector<uint8_t> h(bytes);
    cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost);
    return h;
  }
};

// Random bytes with the type's awkward values mixed in.
std::vector<uint8_t> inputs(ecclDataType_t type, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  size_t es = coll::typeSize(type);
  std::vector<uint8_t> b(n * es);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  auto put = [&](size_t i, auto v) { std::memcpy(&b[i * es], &v, sizeof(v)); };
  for (size_t i = 0; i < n; i += 7) {
    switch (type) {
      case ecclFloat32: {
        float special[] = {NAN, INFINITY, -INFINITY, 1e-45f, -0.0f, 3.4e38f, 1.0f};
        put(i, special[(i / 7) % 7]);
        break;
      }
      case ecclFloat64: {
        double special[] = {NAN, INFINITY, -INFINITY, 5e-324, -0.0, 1.7e308, 1.0};
        put(i, special[(i / 7) % 7]);
        break;
      }
      case ecclFloat16: case ecclBfloat16: {
        uint16_t special[] = {0x7e00, 0x7c00, 0xfc00, 0x0001, 0x8000, 0x7bff, 0x7f81};
        put(i, special[(i / 7) % 7]);
        break;
      }
      case ecclInt32: put(i, (i / 7) % 2 ? std::numeric_limits<int32_t>::max() : std::numeric_limits<int32_t>::min()); break;
      case ecclInt64: put(i, (i / 7) % 2 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min()); break;
      default: break;
    }
  }
  return b;
}

const ecclDataType_t kTypes[] = {ecclInt8, ecclUint8, ecclInt32, ecclUint32, ecclInt64,
                                 ecclUint64, ecclFloat16, ecclFloat32, ecclFloat64, ecclBfloat16};

TEST(ReduceCuda, EveryTypeAndOpMatchesTheCpuReferenceBitForBit) {
  REQUIRE_GPU();
  const size_t n = 100003;  // not a multiple of any block
  for (ecclDataType_t type : kTypes) {
    for (int op = 0; op < ecclNumOps; ++op) {
      auto a = inputs(type, n, 1 + type * 10 + op), b = inputs(type, n, 1000 + type * 10 + op);
      std::vector<uint8_t> want(a.size());
      coll::reduce(want.data(), a.data(), b.data(), n, type, static_cast<ecclRedOp_t>(op));
      Device da(a), db(b), out(std::vector<uint8_t>(a.size()));
      reduce(out.p, da.p, db.p, n, type, static_cast<ecclRedOp_t>(op), nullptr);
      reduce(da.p, da.p, db.p, n, type, static_cast<ecclRedOp_t>(op), nullptr);  // in place
      synchronize(nullptr);
      EXPECT_EQ(out.get(), want) << coll::typeName(type) << " " << coll::opName(static_cast<ecclRedOp_t>(op));
      EXPECT_EQ(da.get(), want) << "in place: " << coll::typeName(type) << " " << coll::opName(static_cast<ecclRedOp_t>(op));
    }
  }
}

TEST(ReduceCuda, TheAverageDividesLikeTheReference) {
  REQUIRE_GPU();
  const size_t n = 4099;
  for (ecclDataType_t type : kTypes) {
    if (coll::isHalfType(type)) continue;
    auto a = inputs(type, n, 77 + type);
    std::vector<uint8_t> want = a;
    coll::finishAverage(want.data(), n, type, 7);
    Device d(a);
    finishAverage(d.p, n, type, 7, nullptr);
    synchronize(nullptr);
    EXPECT_EQ(d.get(), want) << coll::typeName(type);
  }
}

TEST(ReduceCuda, HalfConversionsMatchTheReference) {
  REQUIRE_GPU();
  for (ecclDataType_t type : {ecclFloat16, ecclBfloat16}) {
    std::vector<uint8_t> halves(65536 * 2);
    for (uint32_t i = 0; i < 65536; ++i) std::memcpy(&halves[i * 2], &i, 2);  // every value
    std::vector<float> wide(65536);
    coll::widenToFloat(halves.data(), wide.data(), 65536, type);
    Device dh(halves), dw(std::vector<uint8_t>(65536 * 4));
    widenToFloat(dh.p, static_cast<float*>(dw.p), 65536, type, nullptr);
    synchronize(nullptr);
    auto gotWide = dw.get();
    EXPECT_EQ(std::memcmp(gotWide.data(), wide.data(), gotWide.size()), 0) << coll::typeName(type);
    // Narrowing: floats around every rounding boundary, and specials.
    auto floats = inputs(ecclFloat32, 200003, 5 + type);
    std::vector<uint8_t> narrow(200003 * 2);
    coll::narrowFromFloat(reinterpret_cast<const float*>(floats.data()), narrow.data(), 200003, type);
    Device df(floats), dn(std::vector<uint8_t>(narrow.size()));
    narrowFromFloat(static_cast<const float*>(df.p), dn.p, 200003, type, nullptr);
    synchronize(nullptr);
    EXPECT_EQ(dn.get(), narrow) << coll::typeName(type);
  }
}

}  // namespace
}  // namespace eccl::kernels::cuda
