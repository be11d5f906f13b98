// The verbs building blocks of the ibverbs back end (docs/transport.md):
// an opened device with its port, GID and protection domain; a completion
// queue with its event channel (one serves many queue pairs, so the
// wake-up belongs to the back end, not to a lane); an RC queue pair driven
// from RESET to RTS against a peer's endpoint; a registration cache.
//
// A peer's endpoint (queue pair number, PSN, GID, MTU) and the rkeys of
// its buffers arrive over eccl's authenticated bootstrap stream only: the
// types here never listen or dial.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"

namespace eccl::transport::ibverbs {

// Which device, port and GID a process uses, and the protection domain
// every queue pair and registration of the process shares.
class Context {
 public:
  // `hca`: a device name, optionally with ":port" (ECCL_IB_HCA); empty:
  // the first device with an ACTIVE port. `gidIndex` < 0: chosen (a RoCE v2
  // GID holding an IPv4 address first, then any RoCE v2 GID that is not
  // link-local, then index 0, which is what InfiniBand uses). Throws naming
  // the devices and ports there are when none fits.
  static std::unique_ptr<Context> open(const std::string& hca, int gidIndex);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  ibv_context* raw() const { return context_; }
  ibv_pd* pd() const { return pd_; }
  uint8_t port() const { return port_; }
  int gidIndex() const { return gidIndex_; }
  const ibv_gid& gid() const { return gid_; }
  uint16_t lid() const { return lid_; }
  ibv_mtu activeMtu() const { return mtu_; }
  bool ethernet() const { return ethernet_; }
  const std::string& name() const { return name_; }
  // "rxe0 port 1 GID 3 (::ffff:169.254.77.1, RoCE v2), MTU 4096".
  std::string describe() const;
  // The device's asynchronous events (its port went down, a queue pair
  // failed), read without blocking by whichever lane saw asyncFd() readable
  // and kept for every lane to find: a link that dies quietly (no peer
  // process exited, no packet comes back) still fails the lanes over it.
  int asyncFd() const { return context_->async_fd; }
  void readAsyncEvents();
  // Why queue pair `qpn` cannot work any more; empty while it can.
  std::string failureOf(uint32_t qpn) const;

  // Queue pairs made and destroyed on this context, for the statistics.
  uint64_t queuePairsCreated() const { return queuePairsCreated_.load(std::memory_order_relaxed); }
  uint64_t queuePairsDestroyed() const { return queuePairsDestroyed_.load(std::memory_order_relaxed); }
  uint64_t completionQueuesOpen() const { return completionQueuesOpen_.load(std::memory_order_relaxed); }

 private:
  Context() = default;
  ibv_context* context_ = nullptr;
  ibv_pd* pd_ = nullptr;
  uint8_t port_ = 1;
  int gidIndex_ = 0;
  ibv_gid gid_{};
  uint16_t lid_ = 0;
  ibv_mtu mtu_ = IBV_MTU_1024;
  bool ethernet_ = false;
  std::string name_, gidText_;
  std::atomic<uint64_t> queuePairsCreated_{0}, queuePairsDestroyed_{0}, completionQueuesOpen_{0};
  mutable Mutex asyncMu_{LockRank::kVerbsContext};
  std::string portFailure_ ECCL_GUARDED_BY(asyncMu_);
  std::map<uint32_t, std::string> queuePairFailures_ ECCL_GUARDED_BY(asyncMu_);
  friend class QueuePair;
  friend class CompletionQueue;
};

// A completion queue with its own event channel: fd() is readable once a
// completion arrives after arm().
class CompletionQueue {
 public:
  CompletionQueue(Context& context, int entries);
  ~CompletionQueue();
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;

  ibv_cq* raw() const { return cq_; }
  int fd() const;
  // Asks for an event at the next completion; consumes one that came.
  void arm();
  void consumeEvent();
  // Up to `max` completions now (0: none).
  int poll(ibv_wc* out, int max);
  // Waits for one completion until the deadline (polling, then sleeping on
  // the event channel); throws ecclTimeout naming `what`.
  ibv_wc waitOne(Deadline deadline, const std::string& what);

 private:
  Context& context_;
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
};

// One completion queue serving the queue pairs of many lanes, so a back
// end with many peers has one queue and one event channel rather than one
// of each per lane: each lane reserves room for every completion it can
// have outstanding, attaches as the sink of its queue pair's completions,
// and drain() hands each completion to its sink. Completions for a queue
// pair not attached yet are kept for it; detach() takes whatever is left
// for a destroyed one out of the queue before its number can be reused.
//
// Sinks are called from drain() only; whoever calls drain() must be the
// only thread touching the sinks' lanes then (the device lock does that).
class SharedCompletions {
 public:
  class Sink {
   public:
    virtual void onCompletion(const ibv_wc& wc) = 0;

   protected:
    ~Sink() = default;
  };
  SharedCompletions(Context& context, uint32_t capacity);
  CompletionQueue& queue() { return cq_; }
  // Room for `entries` more outstanding completions; false when full.
  bool reserve(uint32_t entries);
  void unreserve(uint32_t entries);
  void attach(uint32_t qpn, Sink* sink);
  // After the queue pair is destroyed.
  void detach(uint32_t qpn);
  void drain();

 private:
  void pollLocked() ECCL_REQUIRES(mu_);
  CompletionQueue cq_;
  const uint32_t capacity_;
  Mutex mu_{LockRank::kCompletionQueue};
  uint32_t reserved_ ECCL_GUARDED_BY(mu_) = 0;
  std::map<uint32_t, Sink*> sinks_ ECCL_GUARDED_BY(mu_);
  std::vector<ibv_wc> undelivered_ ECCL_GUARDED_BY(mu_);  // polled, for sinks not attached yet
};

// What a peer needs to connect a queue pair to ours.
struct Endpoint {
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint16_t lid = 0;  // InfiniBand only
  uint8_t mtu = 0;   // ibv_mtu
  uint8_t reserved[5] = {};
  ibv_gid gid{};
};
static_assert(sizeof(Endpoint) == 32);

// An RC queue pair, created in RESET and brought to INIT; connect() takes
// it through RTR to RTS against a peer's endpoint.
class QueuePair {
 public:
  struct Limits {
    uint32_t sendDepth = 64, recvDepth = 64;
    uint32_t inlineBytes = 64;
  };
  QueuePair(Context& context, CompletionQueue& send, CompletionQueue& recv, const Limits& limits);
  ~QueuePair();
  QueuePair(const QueuePair&) = delete;
  QueuePair& operator=(const QueuePair&) = delete;

  Endpoint endpoint() const;
  void connect(const Endpoint& remote);
  ibv_qp_state state() const;
  uint32_t qpn() const { return qp_->qp_num; }

  // Posts; wrId comes back in the completion. A failed post throws.
  void postRecv(uint64_t wrId, void* buffer, uint32_t bytes, uint32_t lkey);
  void postWrite(uint64_t wrId, const void* local, uint32_t bytes, uint32_t lkey, uint64_t remote, uint32_t rkey,
                 std::optional<uint32_t> immediate, bool signaled);
  void postSend(uint64_t wrId, const void* local, uint32_t bytes, uint32_t lkey, bool signaled);

 private:
  Context& context_;
  ibv_qp* qp_ = nullptr;
  uint32_t psn_ = 0;
  uint32_t inline_ = 0;
};

// Registered memory by address range: a lookup inside a registration
// reuses it; registrations nobody holds are dropped oldest first once the
// cache holds more than its cap.
class RegistrationCache {
 public:
  RegistrationCache(Context& context, size_t capBytes) : context_(context), cap_(capBytes) {}
  ~RegistrationCache();
  RegistrationCache(const RegistrationCache&) = delete;
  RegistrationCache& operator=(const RegistrationCache&) = delete;

  // A registration covering [address, address + bytes), held until release().
  ibv_mr* acquire(const void* address, size_t bytes);
  void release(ibv_mr* mr);

  struct Stats {
    uint64_t hits = 0, registrations = 0, evictions = 0;
    size_t bytes = 0, entries = 0;
  };
  Stats stats() const;

 private:
  struct Entry {
    ibv_mr* mr;
    int holders = 0;
    std::list<uintptr_t>::iterator idle;  // in idle_ while nobody holds it
  };
  void evictIdle();
  Context& context_;
  size_t cap_;
  std::map<uintptr_t, Entry> entries_;  // by start address
  std::list<uintptr_t> idle_;           // oldest release first
  Stats stats_;
};

// "rxe0 (port 1 ACTIVE), mlx5_0 (port 1 DOWN)": for errors.
std::string describeDevices();

}  // namespace eccl::transport::ibverbs
