// The spin-wait hint: tells the core a loop polls memory (and, on a shared
// core, lets its sibling run).
#pragma once

namespace eccl {

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace eccl
