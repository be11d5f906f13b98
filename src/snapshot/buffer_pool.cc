#include "snapshot/buffer_pool.h"

namespace eccl::snapshot {

Buffer::~Buffer() {
  if (auto pool = pool_.lock()) pool->give(std::move(bytes_), size_);
}

std::shared_ptr<Buffer> BufferPool::take(size_t bytes) {
  {
    MutexLock lock(mu_);
    auto it = free_.find(bytes);
    if (it != free_.end()) {
      auto reused = std::make_shared<Buffer>(std::move(it->second), bytes, weak_from_this());
      free_.erase(it);
      freeBytes_ -= bytes;
      return reused;
    }
  }
  return std::make_shared<Buffer>(std::unique_ptr<uint8_t[]>(new uint8_t[bytes ? bytes : 1]), bytes,
                                  weak_from_this());
}

void BufferPool::give(std::unique_ptr<uint8_t[]> bytes, size_t size) {
  MutexLock lock(mu_);
  if (freeBytes_ + size > cap_) return;  // freed here
  free_.emplace(size, std::move(bytes));
  freeBytes_ += size;
}

void BufferPool::setCap(size_t bytes) {
  MutexLock lock(mu_);
  cap_ = bytes;
  while (freeBytes_ > cap_ && !free_.empty()) {
    auto largest = std::prev(free_.end());
    freeBytes_ -= largest->first;
    free_.erase(largest);
  }
}

std::shared_ptr<Buffer> unpooledBuffer(size_t bytes) {
  return std::make_shared<Buffer>(std::unique_ptr<uint8_t[]>(new uint8_t[bytes ? bytes : 1]), bytes,
                                  std::weak_ptr<BufferPool>());
}

}  // namespace eccl::snapshot
