#pragma once

#include <chrono>
#include <cstdint>

namespace eccl {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

inline Deadline deadlineAfterMs(int64_t ms) { return Clock::now() + std::chrono::milliseconds(ms); }
// Rounded up: it is a poll() timeout, and 0 for a deadline still 0.9 ms
// away made every timed loop spin until it passed (4,096 members' threads
// spinning before each heartbeat took most of two cores).
inline int64_t msUntil(Deadline d) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(d - Clock::now()).count();
  return left < 0 ? 0 : left;
}

}  // namespace eccl
