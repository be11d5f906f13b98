#include "transport/fast_channel.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <new>

#include "common/error.h"

namespace eccl::transport {

// The header fills one cache line; the flag is its first word and is
// stored last (release) by the producer, cleared (release) by the consumer.
struct FastChannel::Slot {
  alignas(64) std::atomic<uint64_t> flag;  // 0: free; else the message's position + 1
  uint64_t seq;
  uint32_t epoch;
  uint32_t tag;
  uint32_t bytes;
  uint32_t hasSignature;
  uint8_t signature[CallSignature::kWireBytes];
  uint8_t payload[kPayloadBytes];
};

size_t FastChannel::footprint() {
  static_assert(offsetof(Slot, payload) <= 64, "the header fills one cache line");
  static_assert(std::atomic<uint64_t>::is_always_lock_free, "the flag is shared between processes");
  return kSlots * sizeof(Slot);
}

void FastChannel::create(void* memory) {
  auto* slots = static_cast<Slot*>(memory);
  for (size_t i = 0; i < kSlots; ++i) new (&slots[i].flag) std::atomic<uint64_t>(0);
}

FastChannel::FastChannel(std::shared_ptr<void> owner, void* tx, void* rx, std::function<bool()> closed)
    : owner_(std::move(owner)), tx_(tx), rx_(rx), closed_(std::move(closed)) {}

FastChannel::Slot* FastChannel::slot(void* base, uint64_t position) const {
  return static_cast<Slot*>(base) + position % kSlots;
}

bool FastChannel::trySend(const Header& header, const void* data) {
  if (header.bytes > kPayloadBytes)
    fail(ecclInternalError, "fast channel: a message of {} bytes does not fit a slot of {}", header.bytes, kPayloadBytes);
  Slot* s = slot(tx_, sent_);
  if (s->flag.load(std::memory_order_acquire) != 0) return false;
  s->seq = header.seq;
  s->epoch = header.epoch;
  s->tag = header.tag;
  s->bytes = header.bytes;
  s->hasSignature = header.hasSignature ? 1 : 0;
  if (header.hasSignature) encodeSignature(header.signature, s->signature);
  if (header.bytes) std::memcpy(s->payload, data, header.bytes);
  s->flag.store(++sent_, std::memory_order_release);
  return true;
}

const FastChannel::Message* FastChannel::peek() {
  if (peeked_) return &head_;
  Slot* s = slot(rx_, received_);
  if (s->flag.load(std::memory_order_acquire) != received_ + 1) return nullptr;
  head_.header.seq = s->seq;
  head_.header.epoch = s->epoch;
  head_.header.tag = s->tag;
  // The peer's word is checked, not trusted: a length past the slot or a
  // signature out of range is read as a disagreement, never followed.
  head_.header.bytes = std::min<uint32_t>(s->bytes, kPayloadBytes + 1);
  head_.header.hasSignature = false;
  if (s->hasSignature) {
    if (auto decoded = decodeSignature(s->signature, nullptr)) {
      head_.header.hasSignature = true;
      head_.header.signature = *decoded;
    } else {
      head_.header.bytes = kPayloadBytes + 1;
    }
  }
  head_.data = s->payload;
  peeked_ = true;
  return &head_;
}

void FastChannel::pop() {
  if (!peeked_) return;
  peeked_ = false;
  slot(rx_, received_)->flag.store(0, std::memory_order_release);
  ++received_;
}

bool FastChannel::closed() const { return closed_(); }

}  // namespace eccl::transport
