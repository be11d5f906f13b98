#include "common/copy.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace eccl::detail {

namespace {

#if defined(__x86_64__)
// 128 bytes a round: four loads, then four stores, so no store waits on a
// load from the line it aliases.
__attribute__((target("avx2"))) void copyAvx2(unsigned char* d, const unsigned char* s, size_t n) {
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 64), c);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 96), e);
  }
  std::memcpy(d + i, s + i, n - i);  // under 128 bytes: no `rep movsb`
}

bool hasAvx2() {
  static const bool has = (__builtin_cpu_init(), __builtin_cpu_supports("avx2"));
  return has;
}
#endif

}  // namespace

void copyAcrossPageAliasing(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  // The CPUs measured slow at these distances (AMD Zen, with FSRM) all
  // have AVX2; one without it keeps memcpy.
  if (hasAvx2()) copyAvx2(d, s, n);
  else std::memcpy(d, s, n);
#else
  std::memcpy(dst, src, n);
#endif
}

}  // namespace eccl::detail
