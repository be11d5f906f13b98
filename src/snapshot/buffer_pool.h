// Host buffers for snapshot copies, recycled: every version allocates as
// many bytes as the one it supersedes frees, and fresh memory costs a page
// fault and a zeroing per page (a third of the CPU a snapshot took here).
// A freed buffer returns to the pool while the pool holds less than its
// cap (about one version's bytes); the memory is uninitialised.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>

#include "common/mutex.h"

namespace eccl::snapshot {

class BufferPool;

class Buffer {
 public:
  Buffer(std::unique_ptr<uint8_t[]> bytes, size_t size, std::weak_ptr<BufferPool> pool)
      : bytes_(std::move(bytes)), size_(size), pool_(std::move(pool)) {}
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  uint8_t* data() { return bytes_.get(); }
  const uint8_t* data() const { return bytes_.get(); }
  size_t size() const { return size_; }

 private:
  std::unique_ptr<uint8_t[]> bytes_;
  size_t size_;
  std::weak_ptr<BufferPool> pool_;
};

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  // A buffer of exactly `bytes` (a pooled one when there is one).
  std::shared_ptr<Buffer> take(size_t bytes);
  void give(std::unique_ptr<uint8_t[]> bytes, size_t size);
  void setCap(size_t bytes);

 private:
  mutable Mutex mu_;
  std::multimap<size_t, std::unique_ptr<uint8_t[]>> free_ ECCL_GUARDED_BY(mu_);
  size_t freeBytes_ ECCL_GUARDED_BY(mu_) = 0;
  size_t cap_ ECCL_GUARDED_BY(mu_) = 0;
};

// A buffer outside any pool (tests, files read back).
std::shared_ptr<Buffer> unpooledBuffer(size_t bytes);

}  // namespace eccl::snapshot
