#include "transport/ibverbs/ring_lane.h"

#include <arpa/inet.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/copy.h"
#include "common/error.h"
#include "common/log.h"
#include "transport/ibverbs/library.h"

namespace eccl::transport::ibverbs {
namespace {

ibv_mr* registerOrFail(Context& c, void* address, size_t bytes, const std::string& what) {
  ibv_mr* mr = verbs().reg_mr(c.pd(), address, bytes,
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  if (!mr) fail(ecclSystemError, "{}: registering {} bytes: {}", what, bytes, strerror(errno));
  return mr;
}

}  // namespace

bool RingLane::validRingBytes(uint64_t bytes) {
  return bytes >= 4096 && bytes <= (1ull << 30) && (bytes & (bytes - 1)) == 0;
}

namespace {

std::shared_ptr<SharedCompletions> ownCompletions(Context& context) {
  auto own = std::make_shared<SharedCompletions>(context, RingLane::kCompletionEntries);
  own->reserve(RingLane::kCompletionEntries);
  return own;
}

}  // namespace

RingLane::RingLane(Context& context, Fd stream, size_t ringBytes, std::string label, size_t zeroCopyBytes,
                   std::shared_ptr<SharedCompletions> completions, RegistrationCache* cache,
                   std::atomic<uint64_t>* cacheHits)
    : context_(context),
      label_(std::move(label)),
      stream_(std::move(stream)),
      completions_(completions ? std::move(completions) : ownCompletions(context)),
      queuePair_(std::in_place, context, completions_->queue(), completions_->queue(),
                 QueuePair::Limits{kSendDepth, kRecvDepth, 64}),
      qp_(*queuePair_),
      ringBytes_(ringBytes),
      zeroCopyBytes_(zeroCopyBytes),
      cache_(cache),
      cacheHits_(cacheHits) {
  ECCL_CHECK_ARG(validRingBytes(ringBytes), "{}: a ring of {} bytes (a power of two, 4 KiB to 1 GiB)", label_,
                 ringBytes);
  recvRing_ = std::make_unique<uint8_t[]>(ringBytes_);
  recvMr_ = registerOrFail(context, recvRing_.get(), ringBytes_, label_);
  wordsMr_ = registerOrFail(context, const_cast<uint64_t*>(words_), sizeof(words_), label_);
  epoll_ = Fd(epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_) fail(ecclSystemError, "{}: epoll_create1: {}", label_, strerror(errno));
  for (int fd : {stream_.get(), completions_->queue().fd(), context_.asyncFd()}) {
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.fd = fd;
    if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &e) != 0)
      fail(ecclSystemError, "{}: epoll_ctl: {}", label_, strerror(errno));
  }
}

RingLane::~RingLane() {
  const uint32_t qpn = qp_.qpn();
  queuePair_.reset();
  completions_->detach(qpn);
  completions_->unreserve(kCompletionEntries);
  for (ibv_mr* mr : {recvMr_, sendMr_, wordsMr_})
    if (mr) verbs().dereg_mr(mr);
  for (ibv_mr* mr : registrations_) verbs().dereg_mr(mr);
  for (ibv_mr* mr : cached_) cache_->release(mr);
}

LaneOffer RingLane::offer() const {
  LaneOffer o;
  o.endpoint = qp_.endpoint();
  o.ringAddress = reinterpret_cast<uintptr_t>(recvRing_.get());
  o.ringKey = recvMr_->rkey;
  o.ringBytes = static_cast<uint32_t>(ringBytes_);
  o.creditAddress = reinterpret_cast<uintptr_t>(&words_[0]);
  o.creditKey = wordsMr_->rkey;
  return o;
}

void RingLane::connect(const LaneOffer& peer) {
  if (!validRingBytes(peer.ringBytes) || peer.ringAddress == 0 || peer.creditAddress == 0)
    fail(ecclRemoteError, "{}: the peer offered a malformed ring ({} bytes at {:#x}, credit word at {:#x})", label_,
         peer.ringBytes, peer.ringAddress, peer.creditAddress);
  peer_ = peer;
  peerRingBytes_ = peer.ringBytes;
  sendRing_ = std::make_unique<uint8_t[]>(peerRingBytes_);
  sendMr_ = registerOrFail(context_, sendRing_.get(), peerRingBytes_, label_);
  qp_.connect(peer.endpoint);
  for (uint32_t i = 0; i < kRecvDepth; ++i) qp_.postRecv(0, nullptr, 0, 0);
  // Last: from here on another lane's drain may deliver this one's
  // completions (none can come before the peer hears we are ready).
  completions_->attach(qp_.qpn(), this);
}

uint64_t RingLane::peerConsumed() const {
  return __atomic_load_n(const_cast<uint64_t*>(&words_[0]), __ATOMIC_ACQUIRE);
}

// Takes this lane's completions (and hands the other lanes theirs) from
// the shared queue, and notes a failure the device reported.
void RingLane::drainCompletions() {
  if (broken_.empty()) {
    std::string failure = context_.failureOf(qp_.qpn());
    if (!failure.empty()) broken_ = failure;
  }
  completions_->drain();
  if (arrived_ - consumed_ > ringBytes_ && broken_.empty())
    broken_ = fmt::format("the peer wrote {} bytes into a ring of {}", arrived_ - consumed_, ringBytes_);
}

// A completion: a write of ours that finished (its slots are free again), a
// write of the peer's into our ring (bytes to read), its report of how far
// it has read ours (room to write), or a zero-copy write of ours that
// finished.
void RingLane::onCompletion(const ibv_wc& wc) {
  if (wc.status != IBV_WC_SUCCESS) {
    if (broken_.empty())
      broken_ = fmt::format("a work request failed: {} (the peer is gone, or its queue pair is in error)",
                            verbs().wc_status_str(wc.status));
    return;
  }
  if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    uint32_t imm = ntohl(wc.imm_data);
    if (!(imm & kCreditFlag)) arrived_ += imm;
    qp_.postRecv(0, nullptr, 0, 0);
    return;
  }
  if (wc.wr_id & kZeroCopyWrite) zeroCopyDone_++;  // sends finish in the order posted
  retired_ = std::max<uint64_t>(retired_, (wc.wr_id & ~kZeroCopyWrite) + 1);
}

bool RingLane::postWrite(uint32_t offset, uint32_t bytes) {
  if (!canPost()) return false;
  uint64_t id = posted_++;
  // Signaled now and then, and always when the queue is about to fill, so
  // a completion frees the slots before it.
  bool signaled = id % 16 == 15 || !canPost();
  qp_.postWrite(id, sendRing_.get() + offset, bytes, sendMr_->lkey, peer_.ringAddress + offset, peer_.ringKey, bytes,
                signaled);
  return true;
}

void RingLane::returnCredit() {
  if (!canPost()) return;  // retried at the next read
  words_[1] = consumed_;
  uint64_t id = posted_++;
  bool signaled = id % 16 == 15 || !canPost();
  // Inline: the word is copied at the post, so the next report may change it.
  qp_.postWrite(id, const_cast<uint64_t*>(&words_[1]), 8, wordsMr_->lkey, peer_.creditAddress, peer_.creditKey,
                kCreditFlag, signaled);
  reported_ = consumed_;
}

ssize_t RingLane::write(const iovec* iov, int count) {
  drainCompletions();
  if (!broken_.empty()) {
    errno = ECONNRESET;
    return -1;
  }
  size_t room = peerRingBytes_ - static_cast<size_t>(sent_ - peerConsumed());
  // A full ring to a peer that is gone would wait for ever: Soft-RoCE
  // reported no failed write to a destroyed queue pair within 30 s. The
  // stream says it at once.
  if ((room == 0 || !canPost()) && streamEnded()) {
    errno = ECONNRESET;
    return -1;
  }
  // Every iovec is copied into the ring first and the span goes in as few
  // writes as the ring's end allows (one, or two across the wrap): each
  // write costs the peer a completion, and a frame's header and payload
  // arrive as separate iovecs.
  if (!canPost()) return 0;
  size_t done = 0;
  const uint64_t spanStart = sent_;
  for (int i = 0; i < count && room > 0; ++i) {
    const auto* from = static_cast<const uint8_t*>(iov[i].iov_base);
    size_t left = std::min(iov[i].iov_len, room);
    while (left > 0) {
      size_t at = static_cast<size_t>(sent_ & (peerRingBytes_ - 1));
      size_t piece = std::min(left, peerRingBytes_ - at);
      copyBytes(sendRing_.get() + at, from, piece);
      sent_ += piece, done += piece, from += piece, left -= piece, room -= piece;
    }
  }
  for (uint64_t at = spanStart; at < sent_;) {
    size_t offset = static_cast<size_t>(at & (peerRingBytes_ - 1));
    size_t piece = std::min<uint64_t>(sent_ - at, peerRingBytes_ - offset);
    if (!postWrite(static_cast<uint32_t>(offset), static_cast<uint32_t>(piece))) {
      // No room in the send queue for the part past the wrap: it is not
      // sent, and the caller offers it again.
      done -= static_cast<size_t>(sent_ - at);
      sent_ = at;
      break;
    }
    at += piece;
  }
  return static_cast<ssize_t>(done);
}

ssize_t RingLane::read(void* into, size_t n) {
  drainCompletions();
  size_t available = static_cast<size_t>(arrived_ - consumed_);
  if (available == 0) {
    if (!broken_.empty()) {
      errno = ECONNRESET;
      return -1;
    }
    if (streamEnded()) return 0;
    errno = EAGAIN;
    return -1;
  }
  size_t take = std::min(n, available);
  auto* to = static_cast<uint8_t*>(into);
  for (size_t left = take; left > 0;) {
    size_t at = static_cast<size_t>(consumed_ & (ringBytes_ - 1));
    size_t piece = std::min(left, ringBytes_ - at);
    copyBytes(to, recvRing_.get() + at, piece);
    consumed_ += piece, to += piece, left -= piece;
  }
  if (consumed_ - reported_ >= ringBytes_ / 4) returnCredit();
  return static_cast<ssize_t>(take);
}

// A registration per transfer: one kept for later would go on naming the
// old pages of memory the application freed and allocated again.
std::optional<Conduit::Window> RingLane::expose(void* buffer, size_t bytes) {
  if (cache_) {
    if (ibv_mr* mr = fromCache(buffer, bytes)) return Window{reinterpret_cast<uintptr_t>(buffer), mr->rkey,
                                                             reinterpret_cast<uintptr_t>(mr)};
    return std::nullopt;
  }
  ibv_mr* mr = verbs().reg_mr(context_.pd(), buffer, bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!mr) {
    log::info("{}: cannot register {} bytes to receive into ({}); they come through the ring", label_, bytes,
              strerror(errno));
    return std::nullopt;
  }
  registrations_.insert(mr);
  return Window{reinterpret_cast<uintptr_t>(buffer), mr->rkey, reinterpret_cast<uintptr_t>(mr)};
}

uint64_t RingLane::pin(const void* buffer, size_t bytes) {
  if (cache_) return reinterpret_cast<uintptr_t>(fromCache(buffer, bytes));
  // Read access only: a send may come from read-only memory.
  ibv_mr* mr = verbs().reg_mr(context_.pd(), const_cast<void*>(buffer), bytes, 0);
  if (!mr) {
    log::info("{}: cannot register {} bytes to send from ({}); they go through the ring", label_, bytes,
              strerror(errno));
    return 0;
  }
  registrations_.insert(mr);
  return reinterpret_cast<uintptr_t>(mr);
}

void RingLane::release(uint64_t handle) {
  auto* mr = reinterpret_cast<ibv_mr*>(handle);
  if (mr && registrations_.erase(mr)) verbs().dereg_mr(mr);
  if (auto held = mr ? cached_.find(mr) : cached_.end(); held != cached_.end()) {
    cached_.erase(held);
    cache_->release(mr);
  }
}

// A cached registration covers send and receive alike (it is made for
// local and remote access); memory that cannot be registered so (read-only
// pages) goes through the ring.
ibv_mr* RingLane::fromCache(const void* buffer, size_t bytes) {
  try {
    const uint64_t hitsBefore = cache_->stats().hits;
    ibv_mr* mr = cache_->acquire(buffer, bytes);
    cached_.insert(mr);
    if (cacheHits_ && cache_->stats().hits > hitsBefore) cacheHits_->fetch_add(1, std::memory_order_relaxed);
    return mr;
  } catch (const Error& e) {
    log::info("{}: {}; the chunk goes through the ring", label_, e.what());
    return nullptr;
  }
}

bool RingLane::writeZeroCopy(uint64_t pinned, const void* buffer, size_t bytes, uint64_t address, uint32_t key) {
  drainCompletions();
  if (!broken_.empty()) return true;  // shows in the next write()
  if (!canPost()) return false;
  auto* mr = reinterpret_cast<ibv_mr*>(pinned);
  uint64_t id = posted_++ | kZeroCopyWrite;
  qp_.postWrite(id, buffer, static_cast<uint32_t>(bytes), mr->lkey, address, key, std::nullopt, /*signaled=*/true);
  return true;
}

// The stream's end of file is the peer's death (nothing is sent on it
// after the set-up).
bool RingLane::streamEnded() {
  if (streamClosed_) return true;
  char probe;
  ssize_t r = ::recv(stream_.get(), &probe, 1, MSG_PEEK | MSG_DONTWAIT);
  streamClosed_ = r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  return streamClosed_;
}

void RingLane::onPollReady() {
  completions_->queue().consumeEvent();  // non-blocking: nothing to consume when the stream woke us
  context_.readAsyncEvents();
}

bool RingLane::armWakeup(bool wantSpace) {
  drainCompletions();
  if (arrived_ > consumed_ || !broken_.empty()) return false;
  if (consumed_ - reported_ >= ringBytes_ / 4) returnCredit();
  if (wantSpace && sent_ - peerConsumed() < peerRingBytes_ && canPost()) return false;
  completions_->queue().arm();
  // A completion between the drain and the arm raised no event: look again.
  drainCompletions();
  return arrived_ == consumed_ && broken_.empty() && !(wantSpace && sent_ - peerConsumed() < peerRingBytes_);
}

// Called after armWakeup armed the completion queue: a credit arriving
// from now on raises an event.
bool RingLane::armBulkWakeup() {
  drainCompletions();
  return !roomForBulk() && arrived_ == consumed_ && broken_.empty();
}

}  // namespace eccl::transport::ibverbs
