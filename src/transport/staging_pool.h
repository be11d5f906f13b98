// Buffers for messages that arrive before their receive is posted. They
// are reused: a fresh one per early message would cost a page fault per
// 4 KiB on every large op whose peer started first. One per device,
// touched under the device lock; what it holds is capped, and a buffer
// given back past the cap is freed.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace eccl::transport::lanes {

struct StagingBuffer {
  std::unique_ptr<uint8_t[]> bytes;  // uninitialised
  size_t capacity = 0;
  explicit operator bool() const { return bytes != nullptr; }
};

class StagingPool {
 public:
  static constexpr size_t kLimitBytes = size_t(256) << 20;

  explicit StagingPool(size_t limitBytes = kLimitBytes) : limitBytes_(limitBytes) {}

  // The smallest held buffer of at least `bytes`, or a new one of exactly
  // that many (at least one byte, so a zero-length message has an address).
  StagingBuffer take(size_t bytes) {
    auto best = held_.end();
    for (auto it = held_.begin(); it != held_.end(); ++it)
      if (it->capacity >= bytes && (best == held_.end() || it->capacity < best->capacity)) best = it;
    if (best == held_.end()) return {std::unique_ptr<uint8_t[]>(new uint8_t[std::max<size_t>(bytes, 1)]), bytes};
    StagingBuffer taken = std::move(*best);
    heldBytes_ -= taken.capacity;
    held_.erase(best);
    return taken;
  }

  // Takes `buffer` (left empty) and keeps it for a later take, or frees it
  // when keeping it would pass the cap.
  void give(StagingBuffer& buffer) {
    StagingBuffer given = std::exchange(buffer, StagingBuffer{});
    if (!given || heldBytes_ + given.capacity > limitBytes_) return;
    heldBytes_ += given.capacity;
    held_.push_back(std::move(given));
  }

  size_t heldBytes() const { return heldBytes_; }
  size_t heldBuffers() const { return held_.size(); }

 private:
  size_t limitBytes_;
  std::vector<StagingBuffer> held_;
  size_t heldBytes_ = 0;
};

}  // namespace eccl::transport::lanes
