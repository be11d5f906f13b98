#include "core/fast_path.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "common/copy.h"
#include "common/cpu_relax.h"
#include "common/error.h"

namespace eccl {

using transport::FastChannel;
using transport::MemberId;
using transport::Request;
using transport::RequestPtr;

namespace {

// Slot polls between looks at the clock and the device; each look also
// yields the core, which a peer on this core needs to answer (4 ranks on
// 2 cores: 8 B allreduce 7 us with a look every 64 polls and yielding
// from 3 us on, 3.5 us like this; 2 ranks on 2 cores unchanged).
constexpr unsigned kSpinsPerCheck = 16;

}  // namespace

FastPath::FastPath(transport::Device& device, size_t maxBytes, int64_t spinUs, int64_t timeoutMs)
    : device_(device),
      maxBytes_(std::min(maxBytes, FastChannel::kPayloadBytes)),
      spinUs_(spinUs),
      timeoutMs_(timeoutMs) {}

void FastPath::beginOp(uint32_t epoch, uint64_t seq, const transport::CallSignature* signature, Deadline deadline) {
  if (epoch != epoch_) recentCount_ = 0;
  epoch_ = epoch;
  seq_ = seq;
  signature_ = signature;
  deadline_ = deadline;
  used_ = 0;
  pending_ = 0;
  if (signature) {
    recent_[recentNext_] = {seq, *signature};
    recentNext_ = (recentNext_ + 1) % kRecentCalls;
    recentCount_ = std::min(recentCount_ + 1, kRecentCalls);
  }
  for (size_t i = stash_.size(); i-- > 0;)
    if (stale(stash_[i].header)) unstash(i);
  for (const Stashed& s : stash_)
    if (current(s.header) && !agrees(s.member, s.header)) break;
}

const transport::CallSignature* FastPath::mineOf(uint32_t epoch, uint64_t seq) const {
  if (epoch != epoch_) return nullptr;
  for (size_t back = 1; back <= recentCount_; ++back) {
    const auto& [recentSeq, signature] = recent_[(recentNext_ + kRecentCalls - back) % kRecentCalls];
    if (recentSeq == seq) return &signature;
  }
  return nullptr;
}

void FastPath::unstash(size_t i) {
  spareBuffers_.push_back(std::move(stash_[i].data));
  stash_.erase(stash_.begin() + static_cast<std::ptrdiff_t>(i));
}

bool FastPath::agrees(MemberId member, const FastChannel::Header& h) {
  if (!h.hasSignature) return true;
  const transport::CallSignature* mine = mineOf(h.epoch, h.seq);
  if (!mine || transport::signaturesAgree(*mine, h.signature)) return true;
  device_.callsDisagree(member, h.seq, *mine, h.signature);
  // The revocation covers this op too (it starts at that op or earlier):
  // nothing of it completes now, as no request of the device's would.
  for (size_t i = 0; i < used_; ++i) {
    Op& op = *ops_[i];
    if (op.request.state.load(std::memory_order_relaxed) != Request::kPending) continue;
    if (auto why = device_.whyOpFails(op.member, seq_, /*commit=*/true)) finish(op, why->first, why->second);
  }
  return false;
}

FastChannel* FastPath::route(MemberId member, size_t bytes) {
  if (maxBytes_ == 0 || bytes > maxBytes_) return nullptr;  // 0: the path is off, empty messages too
  return channel(member);
}

const transport::PeerMemory* FastPath::peerMemory(MemberId member) {
  FastChannel* slots = channel(member);
  return slots ? slots->peerMemory() : nullptr;
}

FastChannel* FastPath::channel(MemberId member) {
  const uint64_t events = device_.failureEvents();
  if (events != channelsAtEvents_ || epoch_ != channelsAtEpoch_) {
    channels_.clear();
    lastLookedUp_ = nullptr;
    channelsAtEvents_ = events;
    channelsAtEpoch_ = epoch_;
  }
  if (lastLookedUp_ && lastLookedUp_->first == member) return lastLookedUp_->second.get();
  auto [it, fresh] = channels_.try_emplace(member);
  if (fresh) it->second = device_.fastChannel(member, deadline_);
  lastLookedUp_ = &*it;
  return it->second.get();
}

bool FastPath::framesWaiting() const {
  for (const auto& [member, channel] : channels_)
    if (channel && channel->framesWaiting()) return true;
  return false;
}

FastPath::Op& FastPath::newOp(FastChannel* channel, MemberId member, int rank, uint32_t tag, size_t bytes,
                              bool isSend) {
  if (used_ == ops_.size()) ops_.push_back(std::make_unique<Op>());
  Op& op = *ops_[used_];
  op.request.state.store(Request::kPending, std::memory_order_relaxed);
  op.request.code = ecclSuccess;
  op.request.error.clear();
  op.request.peer = member;
  op.request.seq = seq_;
  op.request.isSend = isSend;
  op.request.bytes = bytes;
  op.request.fastIndex = static_cast<uint32_t>(++used_);
  op.channel = channel;
  op.member = member;
  op.rank = rank;
  op.tag = tag;
  op.isSend = isSend;
  op.bytes = bytes;
  op.from = nullptr;
  op.into = nullptr;
  ++pending_;
  return op;
}

RequestPtr FastPath::send(FastChannel* channel, MemberId member, int rank, uint32_t tag, const void* buf,
                          size_t bytes) {
  Op& op = newOp(channel, member, rank, tag, bytes, /*isSend=*/true);
  op.from = buf;
  // Behind an earlier send still waiting for a slot on the same channel,
  // so the peer reads them in the order they were posted. Written before
  // anything is read: the peer waits for it (looking at the receives
  // first cost 8 B allreduce at 2 ranks a cache miss before every send).
  bool queued = false;
  for (size_t i = 0; i + 1 < used_ && !queued; ++i)
    queued = ops_[i]->isSend && ops_[i]->channel == channel && ops_[i]->request.state.load() == Request::kPending;
  if (!queued) trySend(op);
  return handle(op);
}

RequestPtr FastPath::recv(FastChannel* channel, MemberId member, int rank, uint32_t tag, void* buf, size_t bytes) {
  Op& op = newOp(channel, member, rank, tag, bytes, /*isSend=*/false);
  op.into = buf;
  for (size_t i = 0; i < stash_.size(); ++i) {
    const Stashed& s = stash_[i];
    if (s.member != member || !current(s.header) || s.header.tag != tag) continue;
    deliver(op, s.header, s.data.data());
    unstash(i);
    break;
  }
  return handle(op);
}

void FastPath::succeed(Op& op) {
  op.request.state.store(Request::kDone, std::memory_order_release);
  --pending_;
}

void FastPath::finish(Op& op, ecclResult_t code, std::string error) {
  if (op.request.state.load(std::memory_order_relaxed) != Request::kPending) return;
  op.request.code = code;
  op.request.error = std::move(error);
  op.request.state.store(code == ecclSuccess ? Request::kDone : Request::kFailed, std::memory_order_release);
  --pending_;
}

void FastPath::deliver(Op& op, const FastChannel::Header& h, const uint8_t* data) {
  if (!agrees(op.member, h)) {
    auto why = device_.whyOpFails(op.member, seq_, /*commit=*/true);
    finish(op, why ? why->first : ecclInvalidUsage,
           why ? why->second : fmt::format("rank {} called {}", op.rank, transport::describe(h.signature)));
    return;
  }
  if (h.bytes != op.bytes) {
    const std::string sent = h.bytes > FastChannel::kPayloadBytes
                                 ? fmt::format("a malformed message of more than {}", FastChannel::kPayloadBytes)
                                 : std::to_string(h.bytes);
    finish(op, ecclInvalidUsage,
           fmt::format("peer rank {} sent {} bytes where {} were expected (mismatched counts or types)", op.rank,
                       sent, op.bytes));
    return;
  }
  if (op.bytes) copyBytes(op.into, data, op.bytes);
  ++counters_.received;
  succeed(op);
}

void FastPath::drain(FastChannel& channel, MemberId member) {
  while (const FastChannel::Message* m = channel.peek()) {
    const FastChannel::Header& h = m->header;
    if (stale(h)) {
      ++counters_.staleDropped;
      agrees(member, h);  // a late message of an op this member ended (a root's broadcast) still says what it was
    } else {
      Op* target = nullptr;
      if (current(h))
        for (size_t i = 0; i < used_ && !target; ++i) {
          Op& op = *ops_[i];
          if (!op.isSend && op.member == member && op.tag == h.tag &&
              op.request.state.load(std::memory_order_relaxed) == Request::kPending)
            target = &op;
        }
      if (target) {
        deliver(*target, h, m->data);
      } else {
        if (current(h)) agrees(member, h);
        Stashed s{member, h, {}};
        if (!spareBuffers_.empty()) {
          s.data = std::move(spareBuffers_.back());
          spareBuffers_.pop_back();
        }
        s.data.clear();
        if (h.bytes <= FastChannel::kPayloadBytes) s.data.assign(m->data, m->data + h.bytes);
        stash_.push_back(std::move(s));
      }
    }
    channel.pop();
  }
}

bool FastPath::write(FastChannel& channel, uint32_t tag, const void* from, size_t bytes) {
  FastChannel::Header h;
  h.epoch = epoch_;
  h.seq = seq_;
  h.tag = tag;
  h.bytes = static_cast<uint32_t>(bytes);
  if (signature_) h.hasSignature = true, h.signature = *signature_;
  if (!channel.trySend(h, from)) return false;
  ++counters_.sent;
  return true;
}

void FastPath::trySend(Op& op) {
  if (write(*op.channel, op.tag, op.from, op.bytes)) succeed(op);
}

bool FastPath::takeExpected(FastChannel& channel, const FastChannel::Message& m, uint32_t tag, void* into,
                            size_t bytes, const FunctionRef<void(const uint8_t*)>* use) {
  const FastChannel::Header& h = m.header;
  if (!current(h) || h.tag != tag || h.bytes != bytes) return false;
  if (h.hasSignature && signature_ && !transport::signaturesAgree(*signature_, h.signature)) return false;
  if (use)
    (*use)(m.data);
  else if (bytes)
    copyBytes(into, m.data, bytes);
  channel.pop();
  ++counters_.received;
  return true;
}

void FastPath::exchange(FastChannel* channel, MemberId member, int rank, uint32_t tag, const void* from,
                        size_t sendBytes, void* into, size_t recvBytes, const FunctionRef<void(const uint8_t*)>* use) {
  if (pending_ == 0 && stash_.empty() && write(*channel, tag, from, sendBytes)) {
    // The peer usually answers within a few hundred nanoseconds; a wait
    // longer than that looks at the device, as every wait does.
    unsigned spun = 0;
    for (; spun + 1 < kSpinsPerCheck; ++spun) {
      if (const FastChannel::Message* m = channel->peek()) {
        if (takeExpected(*channel, *m, tag, into, recvBytes, use)) return;
        break;  // something else is first: the general way sorts it
      }
      cpuRelax();
    }
    wait(recv(channel, member, rank, tag, into, recvBytes), spun);
  } else {
    RequestPtr received = recv(channel, member, rank, tag, into, recvBytes);
    RequestPtr sent = send(channel, member, rank, tag, from, sendBytes);
    wait(received);
    wait(sent);
  }
  if (use) (*use)(static_cast<const uint8_t*>(into));
}

void FastPath::progress() {
  FastChannel* drained[8];
  size_t nDrained = 0;
  for (size_t i = 0; i < used_; ++i) {
    Op& op = *ops_[i];
    if (op.request.state.load(std::memory_order_relaxed) != Request::kPending) continue;
    if (op.isSend) {
      trySend(op);
      continue;
    }
    if (std::find(drained, drained + nDrained, op.channel) != drained + nDrained) continue;
    drain(*op.channel, op.member);
    if (nDrained < std::size(drained)) drained[nDrained++] = op.channel;
  }
}

void FastPath::wait(const RequestPtr& r, unsigned spun) {
  Op& op = *ops_.at(r->fastIndex - 1);
  Clock::time_point started{};  // read at the first look: most waits end before it
  Deadline deadline = deadline_;
  bool probed = false;
  for (unsigned spin = spun + 1; op.request.state.load(std::memory_order_relaxed) == Request::kPending; ++spin) {
    progress();
    if (op.request.state.load(std::memory_order_relaxed) != Request::kPending) break;
    if (spin % kSpinsPerCheck != 0) {
      cpuRelax();
      continue;
    }
    // The device's verdict, when something happened or the lane closed:
    // what arrived before it is still taken first (a peer that finished
    // its part and left in order).
    const uint64_t events = device_.failureEvents();
    if (events != seenEvents_ || op.channel->closed()) {
      seenEvents_ = events;
      if (device_.whyOpFails(op.member, seq_, /*commit=*/false)) {
        progress();
        if (op.request.state.load(std::memory_order_relaxed) != Request::kPending) break;
        if (auto why = device_.whyOpFails(op.member, seq_, /*commit=*/true)) {
          finish(op, why->first, why->second);
          break;
        }
      }
    }
    const auto now = Clock::now();
    if (started == Clock::time_point{}) started = now;
    if (now >= deadline) {
      if (!probed && device_.answersAtDeadline(op.member, seq_, op.isSend)) {
        probed = true;
        deadline = Clock::now() + std::chrono::milliseconds(timeoutMs_);
        continue;
      }
      progress();
      if (op.request.state.load(std::memory_order_relaxed) != Request::kPending) break;
      auto why = device_.whyOpFails(op.member, seq_, /*commit=*/true);
      finish(op, why ? why->first : ecclTimeout,
             why ? why->second : fmt::format("peer rank {} did not {} before the deadline", op.rank,
                                             op.isSend ? "make room for our data" : "send its data"));
      break;
    }
    // Spin while the peer is about to answer; then let others run (a peer
    // on this core needs the scheduler), then sleep in short steps.
    const auto waited = now - started;
    if (waited >= std::chrono::microseconds(200) && now - lookedEverywhere_ >= std::chrono::microseconds(200)) {
      lookedEverywhere_ = now;
      for (auto& [member, channel] : device_.fastChannels()) drain(*channel, member);
    }
    if (waited < std::chrono::microseconds(spinUs_)) {
      sched_yield();
      continue;
    }
    // A receive sleeps on its channel's doorbell, in slices so the checks
    // above still run; a send waiting for a free slot (rare: the peer has
    // 16 unread) sleeps in short steps.
    if (!op.isSend)
      op.channel->waitForMessage(std::min<Deadline>(deadline, now + std::chrono::milliseconds(1)));
    else if (waited < std::chrono::milliseconds(1))
      sched_yield();
    else
      std::this_thread::sleep_for(std::min<Clock::duration>(waited / 16, std::chrono::microseconds(200)));
  }
  if (op.request.state.load(std::memory_order_acquire) == Request::kFailed) throw Error(op.request.code, op.request.error);
}

}  // namespace eccl
