// A collective's small messages to a peer on this host, through the slots
// beside its shared-memory lane (transport/fast_channel.h) instead of the
// device: no request allocated, no map, no device lock, no frame, for the
// messages of at most ECCL_SHM_FAST_PATH_BYTES that latency-bound
// collectives exchange. Everything the general path guarantees still holds:
//  - which way a message goes depends only on its lane and its length, so
//    both ends decide alike (a disagreement about a count that makes one
//    side's message large ends in the signature check, either way);
//  - each message carries the epoch, op, tag and call signature: an older
//    view's or an abandoned op's message is dropped, a later one's is kept
//    for its op, a signature that disagrees revokes the communicator
//    (Device::callsDisagree) as a frame's would;
//  - a waiter polls the device's failure events, so a failed or departed
//    peer, a revocation, a refusal or an abort ends the wait with the
//    device's own reason; at the deadline the peer is pinged and judged as
//    a device wait judges it. Nothing here waits without a deadline.
// Used only by the holder of the caller role (one thread at a time).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "common/clock.h"
#include "common/function_ref.h"
#include "transport/fast_channel.h"
#include "transport/transport.h"

namespace eccl {

class FastPath {
 public:
  // maxBytes: the largest message that goes this way (0: none does).
  FastPath(transport::Device& device, size_t maxBytes, int64_t spinUs, int64_t timeoutMs);

  // Starts op `seq` of view `epoch`, checked against `signature` (null: unchecked).
  void beginOp(uint32_t epoch, uint64_t seq, const transport::CallSignature* signature, Deadline deadline);
  // The slots a message of `bytes` to `member` goes through, or null: the
  // device's way. Opens the member's lanes if they are not (as a post would).
  transport::FastChannel* route(transport::MemberId member, size_t bytes);
  // Where this process may read `member`'s memory (transport/peer_memory.h),
  // or null. Opens the member's lanes if they are not.
  const transport::PeerMemory* peerMemory(transport::MemberId member);
  transport::RequestPtr send(transport::FastChannel* channel, transport::MemberId member, int rank, uint32_t tag,
                             const void* buf, size_t bytes);
  transport::RequestPtr recv(transport::FastChannel* channel, transport::MemberId member, int rank, uint32_t tag,
                             void* buf, size_t bytes);
  static bool owns(const transport::RequestPtr& r) { return r->fastIndex != 0; }
  // send and recv under one tag, both waited for. While nothing else of
  // the op is pending or stashed, the message is written and the answer
  // read straight from the slot, with no op records; anything else (no
  // free slot, no answer yet, a stale message, a disagreement) goes the
  // general way, which decides it as it always does. With `use`, the
  // answer is handed to it in the slot (or, the general way, in `into`)
  // after the send has left. Throws as wait().
  void exchange(transport::FastChannel* channel, transport::MemberId member, int rank, uint32_t tag,
                const void* from, size_t sendBytes, void* into, size_t recvBytes,
                const FunctionRef<void(const uint8_t*)>* use);
  // Whether a lane this path uses holds frames nobody read (a refusal, a
  // notice): ops that take the slots never drive the lanes, so the caller
  // has the device read them before the next op starts, as a wait would.
  bool framesWaiting() const;
  // Completes a request of this path; throws eccl::Error naming the peer.
  // `spun`: polls the caller already made for it (the first look at the
  // device and the first yield come after kSpinsPerCheck in all).
  void wait(const transport::RequestPtr& r, unsigned spun = 0);

  struct Counters {
    uint64_t sent = 0, received = 0, staleDropped = 0;
  };
  Counters counters() const { return counters_; }

 private:
  struct Op {
    transport::Request request;
    transport::FastChannel* channel = nullptr;
    transport::MemberId member = 0;
    int rank = -1;
    uint32_t tag = 0;
    bool isSend = false;
    const void* from = nullptr;
    void* into = nullptr;
    size_t bytes = 0;
  };
  struct Stashed {  // a message that came before its receive was posted
    transport::MemberId member;
    transport::FastChannel::Header header;
    std::vector<uint8_t> data;
  };
  transport::FastChannel* channel(transport::MemberId member);  // the member's slots, or null
  Op& newOp(transport::FastChannel* channel, transport::MemberId member, int rank, uint32_t tag, size_t bytes,
            bool isSend);
  static transport::RequestPtr handle(Op& op) { return transport::RequestPtr(std::shared_ptr<void>(), &op.request); }
  // Writes pending sends, drains the channels pending receives read from.
  void progress();
  void trySend(Op& op);  // completes it when a slot is free
  bool write(transport::FastChannel& channel, uint32_t tag, const void* from, size_t bytes);
  // Takes the channel's next message `m` into `into` when it is this
  // op's under `tag`, of `bytes`, and agrees; false leaves it there.
  bool takeExpected(transport::FastChannel& channel, const transport::FastChannel::Message& m, uint32_t tag,
                    void* into, size_t bytes, const FunctionRef<void(const uint8_t*)>* use);
  void drain(transport::FastChannel& channel, transport::MemberId member);
  void deliver(Op& op, const transport::FastChannel::Header& header, const uint8_t* data);
  void finish(Op& op, ecclResult_t code, std::string error);
  // A pending op's success (its code and error stay as newOp left them):
  // no string built and freed per message.
  void succeed(Op& op);
  // A message's call against this member's call of the same op, whenever
  // they meet (it came early, late or during it): false when they
  // disagree (the communicator is then revoked).
  bool agrees(transport::MemberId member, const transport::FastChannel::Header& h);
  const transport::CallSignature* mineOf(uint32_t epoch, uint64_t seq) const;
  bool current(const transport::FastChannel::Header& h) const { return h.epoch == epoch_ && h.seq == seq_; }
  bool stale(const transport::FastChannel::Header& h) const {
    return h.epoch < epoch_ || (h.epoch == epoch_ && h.seq < seq_);
  }

  transport::Device& device_;
  const size_t maxBytes_;
  const int64_t spinUs_;
  const int64_t timeoutMs_;
  uint32_t epoch_ = 0;
  uint64_t seq_ = 0;
  const transport::CallSignature* signature_ = nullptr;
  Deadline deadline_{};
  Clock::time_point lookedEverywhere_{};  // when a waiter last drained every channel
  // Channels by member, looked up again after any failure event or view change.
  std::map<transport::MemberId, std::shared_ptr<transport::FastChannel>> channels_;
  // The entry found last (a latency algorithm asks for one peer twice in a row).
  std::pair<const transport::MemberId, std::shared_ptr<transport::FastChannel>>* lastLookedUp_ = nullptr;
  uint64_t channelsAtEvents_ = 0;
  uint32_t channelsAtEpoch_ = 0;
  uint64_t seenEvents_ = 0;
  std::vector<std::unique_ptr<Op>> ops_;  // reused op to op; this op's are [0, used_)
  size_t used_ = 0;
  size_t pending_ = 0;  // of those, not complete
  // Early messages in arrival order; their buffers are reused, not freed.
  std::vector<Stashed> stash_;
  std::vector<std::vector<uint8_t>> spareBuffers_;
  void unstash(size_t i);
  // This member's recent calls of this view, by op: a ring, newest at
  // recentNext_ - 1 (no allocation per op).
  static constexpr size_t kRecentCalls = 64;
  std::array<std::pair<uint64_t, transport::CallSignature>, kRecentCalls> recent_{};
  size_t recentNext_ = 0, recentCount_ = 0;
  Counters counters_;
};

}  // namespace eccl
