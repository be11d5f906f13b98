// A single-producer, single-consumer byte ring in memory two processes
// share: the shared-memory back end's lane. It carries the same frames as
// a TCP lane (a byte stream), so everything above the back end parses one
// format. The producer and the consumer each sleep on a futex word in the
// ring when it is full or empty; the other side wakes them, and so does a
// failure notice (wakeAll), so a sleeper never outlives its peer.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "common/clock.h"

namespace eccl::transport::shm {

class Ring {
 public:
  // The bytes a ring of `capacity` data bytes occupies (capacity: a power
  // of two, at least 4 KiB).
  static size_t footprint(size_t capacity);
  // Lays a fresh ring out at `memory` (footprint(capacity) bytes, 64-byte
  // aligned), or attaches to one another process laid out there (the
  // capacity is read back and checked against `expected`).
  static Ring* create(void* memory, size_t capacity);
  static Ring* attach(void* memory, size_t expectedCapacity);

  // Copies up to `n` bytes in (out); returns how many, 0 when full (empty).
  // These wake the other side's futex sleepers (waitReadable/waitWritable).
  size_t write(const void* data, size_t n);
  size_t read(void* data, size_t n);
  // The same copies for a side that uses the doorbell protocol below
  // instead of the futex: no atomic read-modify-write per call.
  size_t put(const void* data, size_t n);
  size_t take(void* data, size_t n);
  // Both sides may look at the fill level; each side's own count is exact.
  size_t readable() const;
  size_t writable() const;
  size_t capacity() const { return capacity_; }

  // Sleeps until the ring has room (data), `until` passes or someone calls
  // wakeAll; spins briefly first. Returns at once if it already has.
  void waitWritable(Deadline until, int64_t spinUs);
  void waitReadable(Deadline until, int64_t spinUs);
  // Wakes both sides' sleepers (a failure, an abort, a close).
  void wakeAll();

  // The doorbell protocol of a consumer that sleeps in poll() on a socket
  // rather than on the ring's futex: it arms the ring before it sleeps, and
  // a producer that writes afterwards takes the arm and rings. The arm and
  // the position each side stores are separated by full fences on both
  // sides, so either the sleeper sees the data or the writer sees the arm.
  // armReader returns false (do not sleep) when data is already there;
  // armWriter likewise when there is room.
  bool armReader();
  bool armWriter();
  // A writer that waits for the fill to drop below `fill`, not for room:
  // false when it already has.
  bool armWriterBelow(size_t fill);
  // After a write (a read): true once per arm, when the other side must be rung.
  bool takeReaderArm() { return takeArm(readerArmed_); }
  bool takeWriterArm() { return takeArm(writerArmed_); }

  // Set by either side when it closes or gives up on the ring.
  void markClosed();
  bool closed() const { return closed_.load(std::memory_order_acquire) != 0; }

 private:
  Ring() = default;
  static constexpr uint64_t kMagic = 0x474e495252434345ull;  // "ECCRRING"
  void wake(std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleepers);
  void sleep(std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleepers, uint32_t seen, Deadline until);
  // Spins, then sleeps on `word` until `ready`, `until`, or the ring closes.
  void waitUntil(const std::function<bool()>& ready, std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleepers,
                 Deadline until, int64_t spinUs);

  // Written once at creation.
  uint64_t magic_;
  uint64_t capacity_;
  uint64_t mask_;
  std::atomic<uint32_t> closed_;
  // The producer's and the consumer's positions, each on its own line.
  alignas(64) std::atomic<uint64_t> head_;  // bytes written so far
  alignas(64) std::atomic<uint64_t> tail_;  // bytes read so far
  // Futex words: bumped on every change the other side may sleep on, and
  // a count of sleepers so the common case makes no system call.
  alignas(64) std::atomic<uint32_t> dataSeq_;
  std::atomic<uint32_t> dataSleepers_;
  alignas(64) std::atomic<uint32_t> spaceSeq_;
  std::atomic<uint32_t> spaceSleepers_;
  alignas(64) std::atomic<uint32_t> readerArmed_;
  std::atomic<uint32_t> writerArmed_;
  static bool takeArm(std::atomic<uint32_t>& arm);
  // The data follows the header, from dataOffset() on.
  static size_t dataOffset();
  unsigned char* data() { return reinterpret_cast<unsigned char*>(this) + dataOffset(); }
};

}  // namespace eccl::transport::shm
