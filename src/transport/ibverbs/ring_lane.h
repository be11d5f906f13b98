// One lane over RDMA: the shared-memory ring's design across the wire.
// Each side registers a receive ring; the sender copies its bytes into a
// registered mirror of the peer's ring and RDMA-writes them to the same
// place there, with an immediate carrying the byte count, so the receiver
// learns of them from a completion and never polls memory. The receiver
// gives room back by writing how far it has read into the sender's credit
// word (also with an immediate: the sender wakes on it). A slow receiver
// holds its sender back (write() returns 0); it never fails it.
//
// Chunks of at least zeroCopyBytes skip the rings: the device's rendezvous
// (Conduit::expose, writeZeroCopy) has the sender RDMA-write them from its
// buffer straight into the receiver's, each buffer registered for that
// transfer only (a registration kept across transfers would go on naming
// the old pages of memory the application freed and allocated again),
// unless the back end keeps them in a RegistrationCache on request.
//
// The bootstrap stream stays open beside the queue pair as the lane's
// liveness line, as a shared-memory lane's socket does: its end of file is
// the peer's death. pollFd() is an epoll descriptor over the stream and
// the lane's completion channel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <memory>
#include <optional>
#include <string>

#include "common/socket.h"
#include "transport/conduit.h"
#include "transport/ibverbs/verbs.h"

namespace eccl::transport::ibverbs {

// What each side sends the other over the authenticated stream.
struct LaneOffer {
  Endpoint endpoint;
  uint64_t ringAddress = 0;
  uint64_t creditAddress = 0;
  uint32_t ringKey = 0, creditKey = 0;
  uint32_t ringBytes = 0;
  uint32_t reserved = 0;
};
static_assert(sizeof(LaneOffer) == 64);

class RingLane final : public Conduit, private SharedCompletions::Sink {
 public:
  // Ring sizes a side may offer: powers of two in [4 KiB, 1 GiB].
  static bool validRingBytes(uint64_t bytes);

  // Room for the completions one lane can have outstanding.
  static constexpr uint32_t kCompletionEntries = 256;
  // `completions`: the back end's shared queue, with kCompletionEntries
  // reserved for this lane (released when it goes); null: a queue of its own.
  RingLane(Context& context, Fd stream, size_t ringBytes, std::string label, size_t zeroCopyBytes = 0,
           std::shared_ptr<SharedCompletions> completions = nullptr, RegistrationCache* cache = nullptr,
           std::atomic<uint64_t>* cacheHits = nullptr);
  ~RingLane() override;
  LaneOffer offer() const;
  // Checks the peer's offer and brings the queue pair up; throws naming
  // what is wrong with it.
  void connect(const LaneOffer& peer);

  const char* kind() const override { return "ib"; }
  int pollFd() const override { return epoll_.get(); }
  bool writableByPoll() const override { return false; }
  // Completions are announced on pollFd() only once armed (armWakeup):
  // until the device sleeps it looks at the queue on every pass.
  bool pollsMemory() const override { return true; }
  void onPollReady() override;
  uint32_t queuePairs() const override { return 1; }
  std::string failure() const override { return broken_; }
  ssize_t write(const iovec* iov, int count) override;
  ssize_t read(void* into, size_t n) override;
  bool armWakeup(bool wantSpace) override;
  // The peer reports its reads a quarter of its ring at a time, so what it
  // has not read looks up to a quarter larger than it is: half a ring
  // unread as seen here means at least a quarter the peer will read and
  // report, which wakes us (a credit write carries an immediate).
  bool seesPeerReads() const override { return true; }
  bool roomForBulk() const override { return sent_ - peerConsumed() < peerRingBytes_ / 2; }
  bool armBulkWakeup() override;
  size_t zeroCopyMinBytes() const override { return zeroCopyBytes_; }
  std::optional<Window> expose(void* buffer, size_t bytes) override;
  uint64_t pin(const void* buffer, size_t bytes) override;
  void release(uint64_t handle) override;
  bool writeZeroCopy(uint64_t pinned, const void* buffer, size_t bytes, uint64_t address, uint32_t key) override;
  uint64_t zeroCopyWritesDone() const override { return zeroCopyDone_; }

 private:
  void drainCompletions();
  void onCompletion(const ibv_wc& wc) override;
  ibv_mr* fromCache(const void* buffer, size_t bytes);
  bool postWrite(uint32_t ringOffset, uint32_t bytes);  // false: no send slot free
  void returnCredit();
  bool streamEnded();
  bool canPost() const { return posted_ - retired_ < kSendDepth - 1; }
  uint64_t peerConsumed() const;

  static constexpr uint32_t kSendDepth = 128, kRecvDepth = 128;
  static_assert(kSendDepth + kRecvDepth <= kCompletionEntries);
  static constexpr uint32_t kCreditFlag = 1u << 31;
  static constexpr uint64_t kZeroCopyWrite = 1ull << 63;  // in a send's wr_id
  Context& context_;
  std::string label_;
  Fd stream_, epoll_;
  std::shared_ptr<SharedCompletions> completions_;
  std::optional<QueuePair> queuePair_;  // destroyed first, so its completions can be taken out
  QueuePair& qp_;
  size_t ringBytes_;  // ours: the peer writes into it
  size_t peerRingBytes_ = 0;
  std::unique_ptr<uint8_t[]> recvRing_, sendRing_;
  ibv_mr* recvMr_ = nullptr;
  ibv_mr* sendMr_ = nullptr;
  ibv_mr* wordsMr_ = nullptr;
  // Registered words: [0] the peer's report of how far it has read our
  // writes (written by it), [1] the source of our own reports.
  alignas(64) volatile uint64_t words_[2] = {};
  LaneOffer peer_{};
  uint64_t sent_ = 0;                    // bytes written to the peer's ring
  uint64_t arrived_ = 0, consumed_ = 0;  // bytes in our ring: announced, read
  uint64_t reported_ = 0;                // consumed_ as last written to the peer
  uint64_t posted_ = 0, retired_ = 0;    // send work requests
  std::string broken_;                   // a failed completion: the lane is dead
  bool streamClosed_ = false;
  size_t zeroCopyBytes_;
  std::set<ibv_mr*> registrations_;  // pin() and expose() handles not yet released
  RegistrationCache* cache_;         // the back end's, when zero-copy registrations are kept
  std::atomic<uint64_t>* cacheHits_;
  std::multiset<ibv_mr*> cached_;    // holds on cache_'s registrations, one per handle given out
  uint64_t zeroCopyDone_ = 0;
};

}  // namespace eccl::transport::ibverbs
