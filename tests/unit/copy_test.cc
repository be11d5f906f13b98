// copyBytes and moveBytes (src/common/copy.h): the vector loop taken where
// glibc's `rep movsb` is slow copies every byte memcpy would, at every size
// and distance around the 4 KiB aliasing window; moveBytes keeps memmove's
// answer for overlapping ranges.
#include "common/copy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <vector>

namespace eccl {
namespace {

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 2654435761u + seed) >> 13);
  return v;
}

TEST(CopyBytes, TheAliasingWindowIsOneToSixtyThreeBytesApartModuloAPage) {
  alignas(4096) static uint8_t page[3 * 4096];
  EXPECT_FALSE(copyAliasesPages(page + 4096, page, 4096));       // 0 apart: memcpy is fast
  EXPECT_TRUE(copyAliasesPages(page + 4096 + 16, page, 4096));   // malloc's header between them
  EXPECT_TRUE(copyAliasesPages(page + 4096 + 63, page, 4096));
  EXPECT_FALSE(copyAliasesPages(page + 4096 + 64, page, 4096));
  EXPECT_FALSE(copyAliasesPages(page, page + 16, 4096));          // 4080 apart
  EXPECT_FALSE(copyAliasesPages(page + 4096 + 16, page, 2047));   // below glibc's `rep movsb`
}

TEST(CopyBytes, CopiesWhatMemcpyCopiesAtEverySizeAndDistance) {
  const size_t sizes[] = {0, 1, 63, 64, 127, 128, 129, 2047, 2048, 2049, 4096 + 17, 65536 + 5, 300001};
  const long distances[] = {16, 1, 8, 63, 64, 4096 + 16, 4096 + 40, 4096 - 16};
  void* raw = std::aligned_alloc(4096, 1 << 20);
  ASSERT_NE(raw, nullptr);
  auto* arena = static_cast<uint8_t*>(raw);
  int aliasing = 0;
  for (size_t n : sizes)
    for (long apart : distances)
      for (size_t srcOffset : {size_t{0}, size_t{48}, size_t{4095}}) {
        uint8_t* src = arena + srcOffset;
        uint8_t* dst = src + n + apart + 4096;  // past the source, `apart` beyond a page boundary
        ASSERT_LE(dst + n + 1, arena + (1 << 20));
        const std::vector<uint8_t> want = pattern(n, static_cast<uint32_t>(n + apart));
        std::copy(want.begin(), want.end(), src);
        dst[-1] = 0xA5, dst[n] = 0x5A;  // guards: nothing written outside
        aliasing += copyAliasesPages(dst, src, n);
        copyBytes(dst, src, n);
        ASSERT_TRUE(std::equal(want.begin(), want.end(), dst)) << n << " bytes, " << apart << " apart";
        ASSERT_EQ(dst[-1], 0xA5) << n << " bytes, " << apart << " apart";
        ASSERT_EQ(dst[n], 0x5A) << n << " bytes, " << apart << " apart";
      }
  EXPECT_GT(aliasing, 0) << "no case took the vector loop";
  std::free(raw);
}

TEST(CopyBytes, MoveBytesHandlesOverlapInBothDirections) {
  for (size_t n : {size_t{100}, size_t{5000}, size_t{70000}})
    for (long shift : {-4112L, -16L, -1L, 1L, 16L, 4112L}) {
      std::vector<uint8_t> buf(n + 2 * 4200);
      const std::vector<uint8_t> want = pattern(n, 7);
      uint8_t* src = buf.data() + 4200;
      std::copy(want.begin(), want.end(), src);
      moveBytes(src + shift, src, n);
      ASSERT_TRUE(std::equal(want.begin(), want.end(), src + shift)) << n << " bytes shifted by " << shift;
    }
}

}  // namespace
}  // namespace eccl
