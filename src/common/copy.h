// Copies payload bytes between buffers: memcpy, except where glibc's
// copy is slow on this kind of CPU. From a few KiB to a few hundred KiB
// glibc copies with `rep movsb`; on AMD EPYC (Zen) that ran at 2-3 GB/s
// instead of 50-100 whenever the destination's distance from the source,
// modulo a 4 KiB page, was 1 to 63 bytes. Two back-to-back heap buffers
// (malloc's 16-byte header between them), or a page-aligned ring and a
// buffer from mmap, sit exactly that far apart. Such copies take a vector
// loop (AVX2) instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace eccl {

namespace detail {
void copyAcrossPageAliasing(void* dst, const void* src, size_t n);
}

// The distance (modulo 4 KiB) at which `rep movsb` slows down, and the
// size from which glibc uses it.
inline bool copyAliasesPages(const void* dst, const void* src, size_t n) {
  constexpr size_t kFromBytes = 2048;
  const uintptr_t apart = (reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(src)) & 4095;
  return n >= kFromBytes && apart != 0 && apart < 64;
}

// The kernel's copies between a process and user memory (process_vm_readv
// and _writev, here) use `rep movsb` too: 2.0-2.3 GB/s against 9-11 at 64
// KiB and 1 MiB when the destination lies 1 to 31 bytes past the source
// modulo a page, at every size.
inline bool kernelCopyAliasesPages(uint64_t dst, uint64_t src, size_t n) {
  constexpr size_t kFromBytes = 4096;
  const uint64_t apart = (dst - src) & 4095;
  return n >= kFromBytes && apart != 0 && apart < 32;
}

// memcpy's contract: the ranges must not overlap.
inline void copyBytes(void* dst, const void* src, size_t n) {
  if (copyAliasesPages(dst, src, n)) detail::copyAcrossPageAliasing(dst, src, n);
  else std::memcpy(dst, src, n);
}

// memmove's contract: the ranges may overlap (then memmove copies them).
inline void moveBytes(void* dst, const void* src, size_t n) {
  const auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  if (d + n <= s || s + n <= d) copyBytes(dst, src, n);
  else std::memmove(dst, src, n);
}

}  // namespace eccl
