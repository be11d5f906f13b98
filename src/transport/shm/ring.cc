#include "transport/shm/ring.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include "common/copy.h"
#include "common/error.h"

namespace eccl::transport::shm {
namespace {

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "a ring shared between processes needs lock-free atomics");

// Shared between processes: not FUTEX_PRIVATE_FLAG.
void futexWait(std::atomic<uint32_t>* word, uint32_t expected, const timespec* timeout) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, timeout, nullptr, 0);
}

void futexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

}  // namespace

size_t Ring::dataOffset() { return (sizeof(Ring) + 63) & ~size_t(63); }

size_t Ring::footprint(size_t capacity) { return dataOffset() + capacity; }

Ring* Ring::create(void* memory, size_t capacity) {
  ECCL_CHECK_ARG(capacity >= 4096 && (capacity & (capacity - 1)) == 0,
                 "shared-memory ring capacity {} is not a power of two of at least 4096", capacity);
  ECCL_CHECK_ARG(reinterpret_cast<uintptr_t>(memory) % 64 == 0, "shared-memory ring is not 64-byte aligned");
  std::memset(memory, 0, dataOffset());
  Ring* r = new (memory) Ring;
  r->capacity_ = capacity;
  r->mask_ = capacity - 1;
  r->closed_.store(0, std::memory_order_relaxed);
  r->head_.store(0, std::memory_order_relaxed);
  r->tail_.store(0, std::memory_order_relaxed);
  // The reader has not looked yet, so the first write rings: a thread that
  // sleeps on the lanes armed those it knew, not this one, and an unarmed
  // new ring's first frames once waited out that sleep (a second).
  r->readerArmed_.store(1, std::memory_order_relaxed);
  r->writerArmed_.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  r->magic_ = kMagic;
  return r;
}

Ring* Ring::attach(void* memory, size_t expectedCapacity) {
  auto* r = static_cast<Ring*>(memory);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (r->magic_ != kMagic || r->capacity_ != expectedCapacity)
    fail(ecclRemoteError, "shared-memory ring is not laid out (magic {:#x}, capacity {}, expected {})", r->magic_,
         r->capacity_, expectedCapacity);
  return r;
}

size_t Ring::readable() const {
  return head_.load(std::memory_order_acquire) - tail_.load(std::memory_order_acquire);
}

size_t Ring::writable() const { return capacity_ - readable(); }

size_t Ring::write(const void* src, size_t n) {
  n = put(src, n);
  if (n) wake(dataSeq_, dataSleepers_);
  return n;
}

size_t Ring::read(void* dst, size_t n) {
  n = take(dst, n);
  if (n) wake(spaceSeq_, spaceSleepers_);
  return n;
}

size_t Ring::put(const void* src, size_t n) {
  const uint64_t head = head_.load(std::memory_order_relaxed);
  const uint64_t tail = tail_.load(std::memory_order_acquire);
  n = std::min<size_t>(n, capacity_ - (head - tail));
  if (n == 0) return 0;
  const size_t at = head & mask_, first = std::min<size_t>(n, capacity_ - at);
  copyBytes(data() + at, src, first);
  copyBytes(data(), static_cast<const unsigned char*>(src) + first, n - first);
  head_.store(head + n, std::memory_order_release);
  return n;
}

size_t Ring::take(void* dst, size_t n) {
  const uint64_t tail = tail_.load(std::memory_order_relaxed);
  const uint64_t head = head_.load(std::memory_order_acquire);
  n = std::min<size_t>(n, head - tail);
  if (n == 0) return 0;
  const size_t at = tail & mask_, first = std::min<size_t>(n, capacity_ - at);
  copyBytes(dst, data() + at, first);
  copyBytes(static_cast<unsigned char*>(dst) + first, data(), n - first);
  tail_.store(tail + n, std::memory_order_release);
  return n;
}

// The sequence bump comes before the sleeper check (both seq_cst), and a
// sleeper registers before it re-checks the ring: one of the two always
// sees the other, so no wakeup is lost.
void Ring::wake(std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleepers) {
  word.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers.load(std::memory_order_seq_cst) != 0) futexWakeAll(&word);
}

void Ring::sleep(std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleepers, uint32_t seen, Deadline until) {
  auto left = until - Clock::now();
  if (left <= Clock::duration::zero()) return;
  // Short slices: a wakeAll from a failure notice is a bump too, but the
  // slice bounds the wait should a peer die between the check and the bump.
  auto slice = std::min<Clock::duration>(left, std::chrono::milliseconds(50));
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(slice).count();
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  futexWait(&word, seen, &ts);
}

void Ring::waitUntil(const std::function<bool()>& ready, std::atomic<uint32_t>& word,
                     std::atomic<uint32_t>& sleepers, Deadline until, int64_t spinUs) {
  const auto spinUntil = Clock::now() + std::chrono::microseconds(spinUs);
  while (!ready() && !closed()) {
    if (Clock::now() >= until) return;
    if (Clock::now() < spinUntil) {
      sched_yield();
      continue;
    }
    uint32_t seen = word.load(std::memory_order_seq_cst);
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (!ready() && !closed()) sleep(word, sleepers, seen, until);
    sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

void Ring::waitWritable(Deadline until, int64_t spinUs) {
  waitUntil([this] { return writable() > 0; }, spaceSeq_, spaceSleepers_, until, spinUs);
}

void Ring::waitReadable(Deadline until, int64_t spinUs) {
  waitUntil([this] { return readable() > 0; }, dataSeq_, dataSleepers_, until, spinUs);
}

void Ring::wakeAll() {
  wake(dataSeq_, dataSleepers_);
  wake(spaceSeq_, spaceSleepers_);
}

bool Ring::armReader() {
  readerArmed_.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return readable() == 0 && !closed();
}

bool Ring::armWriter() { return armWriterBelow(capacity_); }  // full: readable() == capacity_

bool Ring::armWriterBelow(size_t fill) {
  writerArmed_.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return readable() >= fill && !closed();
}

bool Ring::takeArm(std::atomic<uint32_t>& arm) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return arm.load(std::memory_order_relaxed) != 0 && arm.exchange(0, std::memory_order_acq_rel) != 0;
}

void Ring::markClosed() {
  closed_.store(1, std::memory_order_release);
  wakeAll();
}

}  // namespace eccl::transport::shm
