// What a collective algorithm sees of the communicator: ranks, and
// nonblocking sends and receives tagged within the current op. Algorithms
// never see members, epochs or sockets, so the same code runs over every
// transport and survives view changes.
#pragma once

#include <cstdint>
#include <vector>

#include "common/function_ref.h"
#include "transport/transport.h"

namespace eccl::coll {

using transport::RequestPtr;

class Links {
 public:
  virtual ~Links() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual RequestPtr isend(int peer, uint32_t tag, const void* buf, size_t bytes) = 0;
  virtual RequestPtr irecv(int peer, uint32_t tag, void* buf, size_t bytes) = 0;
  // Throws eccl::Error naming the op and the peer on failure or deadline.
  virtual void wait(const RequestPtr& request) = 0;
  virtual size_t segmentBytes() const = 0;
  // Uninitialised working memory of at least `bytes`, reused across ops (a
  // fresh zeroed buffer per op costs page faults and a memset that show up
  // as a large share of a big allreduce). Slots do not alias each other;
  // the memory is valid until the op ends.
  virtual uint8_t* scratch(int slot, size_t bytes) = 0;
  // Same host: whether this process may read every peer's memory where it
  // lies (readPeer), as decided for each peer when its lane opened.
  virtual bool readsEveryPeer() { return false; }
  // Copies `bytes` at `address` in `peer`'s memory into `into`. The peer
  // must be held inside the op by messages while it is read; throws
  // eccl::Error naming the op and the peer when the read fails.
  virtual void readPeer(int peer, uint64_t address, void* into, size_t bytes);
  // Sends `sendBytes` from `from` to `peer` and receives `recvBytes` from
  // it into `into`, under one tag, and waits for both: a latency
  // algorithm's step. A transport may do it without a request per message.
  virtual void exchange(int peer, uint32_t tag, const void* from, size_t sendBytes, void* into, size_t recvBytes);
  // The same, with the received bytes handed to `use` where they lie (in
  // the transport's memory where it can, else in `scratch`), valid only
  // during the call, after the send has left `from`: a reduction reads
  // them once instead of after a copy.
  virtual void exchangeAndUse(int peer, uint32_t tag, const void* from, size_t sendBytes, uint8_t* scratch,
                              size_t recvBytes, FunctionRef<void(const uint8_t*)> use);

  void waitAll(std::vector<RequestPtr>& requests) {
    for (auto& r : requests) wait(r);
    requests.clear();
  }
  // A fixed handful (a latency algorithm's step): no allocation per op.
  template <size_t N>
  void waitAll(RequestPtr (&requests)[N]) {
    for (auto& r : requests)
      if (r) wait(r), r.reset();
  }
};

// Tag layout: phase (4 bits) | step (12 bits) | segment (16 bits).
constexpr uint32_t kMaxSteps = 1u << 12;
constexpr uint32_t kMaxSegments = 1u << 16;
inline uint32_t makeTag(uint32_t phase, uint32_t step, uint32_t segment) {
  return (phase << 28) | ((step & (kMaxSteps - 1)) << 16) | (segment & (kMaxSegments - 1));
}

inline int modRank(int64_t x, int n) { return static_cast<int>(((x % n) + n) % n); }

}  // namespace eccl::coll
