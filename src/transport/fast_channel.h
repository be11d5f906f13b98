// Slots for a collective's small messages in memory two processes share,
// beside a lane (the shared-memory back end gives each lane a pair, one per
// direction). The models are Open MPI's vader fast boxes and NCCL's LL
// protocol: the producer copies the payload into a free slot and then
// stores the header's flag (the message's position + 1) with release
// order, in the header's own cache line, so a consumer polling that one
// line sees a whole message; the consumer copies it out and counts it on
// a line of its own, which the producer reads only when the slots it
// knows to be free are used up. No lock, no allocation, no system call on
// the way while the reader polls; a reader that has polled long enough
// sleeps on a futex word beside the slots, and the writer wakes it (a
// locked store and a load per message).
//
// A slot carries what the device's frames carry for a collective: the view
// (epoch), the op, the tag and the call's signature, so the layer above
// (core/fast_path.h) keeps every check of the general path. One producer
// and one consumer per direction: the communicator's caller.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "common/clock.h"
#include "transport/peer_memory.h"
#include "transport/signature.h"

namespace eccl::transport {

class FastChannel {
 public:
  static constexpr size_t kSlots = 16;
  // Recursive doubling's 8 and 16 KiB messages at 4 ranks went through the
  // ring and the device while slots held 4 KiB: 16 KiB allreduce took 43 us
  // where Open MPI took 30. With 16 KiB slots (perf/ab, medians of 9
  // alternating runs): 8 KiB 2.18x, 16 KiB 1.88x, smaller sizes unchanged;
  // the cost is 263 KiB per direction beside each lane's 1 MiB ring.
  static constexpr size_t kPayloadBytes = 16384;

  struct Header {
    uint32_t epoch = 0;
    uint64_t seq = 0;
    uint32_t tag = 0;
    uint32_t bytes = 0;
    bool hasSignature = false;
    CallSignature signature;
  };

  // The bytes one direction's slots occupy (64-byte aligned).
  static size_t footprint();
  // Lays fresh (zeroed) slots out at `memory`; attaching needs nothing.
  static void create(void* memory);

  // `owner` keeps the shared mapping alive while this channel exists (the
  // lane may close first); `closed` says either side closed the lane;
  // `framesWaiting` that the lane itself holds bytes nobody has read (a
  // notice, a refusal: the device should read them).
  FastChannel(std::shared_ptr<void> owner, void* tx, void* rx, std::function<bool()> closed,
              std::function<bool()> framesWaiting);

  // Copies one message into the next slot; false while that slot is still
  // full (the peer has not read it yet). bytes <= kPayloadBytes.
  bool trySend(const Header& header, const void* data);
  // The next message, or null while none is there. Valid until pop().
  struct Message {
    Header header;
    const uint8_t* data;
  };
  const Message* peek();
  void pop();
  bool closed() const;
  bool framesWaiting() const { return framesWaiting_(); }
  // Sleeps until a message may be there, `until`, or a spurious wake-up
  // (a futex in the shared memory: the peer's trySend wakes a reader that
  // said it sleeps; the two sides' fences make sure one sees the other).
  void waitForMessage(Deadline until);

  // The peer's memory, where this process may read it (set once, by the
  // back end, before the channel is shared); null where it may not.
  void setPeerMemory(std::shared_ptr<const PeerMemory> memory) { peerMemory_ = std::move(memory); }
  const PeerMemory* peerMemory() const { return peerMemory_.get(); }

  uint64_t sent() const { return sent_; }
  uint64_t received() const { return received_; }

 private:
  struct Slot;
  struct Doorbell;
  Slot* slot(void* base, uint64_t position) const;
  static Doorbell* doorbell(void* base);

  std::shared_ptr<void> owner_;
  void* tx_;
  void* rx_;
  std::function<bool()> closed_;
  std::function<bool()> framesWaiting_;
  std::shared_ptr<const PeerMemory> peerMemory_;
  uint64_t sent_ = 0;      // messages written so far
  uint64_t received_ = 0;  // messages read so far
  uint64_t peerConsumed_ = 0;  // messages the reader had taken when last looked at
  bool peeked_ = false;
  Message head_{};
  // The last signature peek() decoded (nullopt: malformed or none yet),
  // and its bytes on the wire.
  std::optional<CallSignature> lastDecoded_;
  uint8_t lastWire_[CallSignature::kWireBytes] = {};
};

}  // namespace eccl::transport
