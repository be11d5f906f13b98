// What the fast path (core/fast_path.h) asks of the device: the slots of a
// lane, and the device's verdicts (failures, revocations, refusals,
// liveness at a deadline), which a fast-path op gets as a posted request
// would.
#include "transport/lane_device.h"

namespace eccl::transport::lanes {

// A lane that opened keeps its slots after it closes (Lane::fast), so both
// ends still see the same answer once one of them has left or failed: the
// other takes what was written before, and only then hears the verdict.
std::shared_ptr<FastChannel> LaneDevice::fastChannel(MemberId member, Deadline deadline) {
  {
    MutexLock lock(mu_);
    auto it = peers_.find(member);
    if (it != peers_.end() && !it->second.lanes.empty() && it->second.lanes[0]->fast) return it->second.lanes[0]->fast;
  }
  connectNow(member, deadline);
  MutexLock lock(mu_);
  auto it = peers_.find(member);
  if (it == peers_.end() || it->second.lanes.empty()) return nullptr;
  return it->second.lanes[0]->fast;
}

void LaneDevice::foregroundBeside(MemberId member) {
  // Well inside the lease (kLeaseMs) and bulk's quiet time (2 ms): a
  // turn per read cost 5% of a 1-64 MiB allreduce alone.
  constexpr int64_t kBesideEveryNs = 500'000;
  const auto now = Clock::now();
  const int64_t nowNs = std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  if (nowNs - lastBesideNs_.load(std::memory_order_relaxed) < kBesideEveryNs) return;
  lastBesideNs_.store(nowNs, std::memory_order_relaxed);
  MutexLock lock(mu_);
  if (!peers_.count(member)) return;
  // Every lane in memory, not only the member's: a collective reads
  // several peers, and a turn comes only every kBesideEveryNs.
  for (Lane* lane : memoryLanes_) lane->bulk.foregroundPosted(now);
  // A caller reading peers in place posts nothing on the lanes and waits on
  // none, so the progress thread would copy the lanes' bulk (a snapshot's
  // replication) beside it: on a host with a core per rank that thread
  // takes the core of a rank its partner waits for (a 4 MiB allreduce
  // during a 64 MiB snapshot, 2 ranks: 1.2-1.8 GB/s, 7 alone). The caller
  // takes the lanes between its reads instead, as a caller waiting on them
  // does, under the same lease (6.6-7.0 GB/s, the snapshot no slower).
  // Only while the lanes carry something: an idle progress thread costs
  // nothing, a leased one ticks every kLeaseMs.
  const uint64_t moved = stats_.bytesReceived + stats_.bytesSent;
  serviceLanesLocked();
  bool busy = stats_.bytesReceived + stats_.bytesSent != moved;
  for (const Lane* lane : memoryLanes_) busy = busy || !lane->bulk.empty();
  if (!busy) return;
  setCallerOwnedLocked(true);
  leaseUntil_ = std::max(leaseUntil_, now + std::chrono::milliseconds(kLeaseMs));
}

bool LaneDevice::sharesHostWith(MemberId member) {
  std::vector<std::pair<std::string, std::string>> address;
  {
    MutexLock lock(mu_);
    auto it = peers_.find(member);
    if (it == peers_.end()) return false;
    if (it->second.sharesHost) return *it->second.sharesHost;
    address = it->second.address;
  }
  bool here = false;
  for (const auto& [name, part] : address)
    for (const auto& backend : backends_)
      here = here || (name == backend->name() && backend->listensHere(part));
  MutexLock lock(mu_);
  if (auto it = peers_.find(member); it != peers_.end() && it->second.address == address) it->second.sharesHost = here;
  return here;
}

std::vector<std::pair<MemberId, std::shared_ptr<FastChannel>>> LaneDevice::fastChannels() {
  MutexLock lock(mu_);
  std::vector<std::pair<MemberId, std::shared_ptr<FastChannel>>> out;
  for (auto& [id, p] : peers_)
    if (!p.lanes.empty() && p.lanes[0]->fast) out.emplace_back(id, p.lanes[0]->fast);
  return out;
}

std::optional<std::pair<ecclResult_t, std::string>> LaneDevice::whyOpFails(MemberId member, uint64_t seq,
                                                                           bool commit) {
  MutexLock lock(mu_);
  using Why = std::pair<ecclResult_t, std::string>;
  if (aborted_) return Why{ecclRemoteError, abortReason_};
  if (revokesLocked(seq)) return Why{revokedCode_, revokedReason_};
  if (const std::string* refused = refusalOfLocked(seq)) return Why{ecclInvalidUsage, *refused};
  auto it = peers_.find(member);
  if (it == peers_.end()) return Why{ecclRemoteError, fmt::format("member {:#x} is not a peer any more", member)};
  Peer& p = it->second;
  if (p.state != Peer::State::kFailed && p.state != Peer::State::kLeft) return std::nullopt;
  if (!commit) return Why{p.failCode, p.failReason};
  RequestPtr r = newRequest(member, seq, /*isSend=*/false);
  failIfPeerGoneLocked(r, p);
  return Why{r->code, r->error};
}

bool LaneDevice::answersAtDeadline(MemberId member, uint64_t seq, bool sending) {
  MutexLock lock(mu_);
  if (pingLocked(member, seq)) {
    const auto sent = Clock::now();
    const auto grace = sent + std::chrono::milliseconds(500);
    while (Clock::now() < grace) {
      auto it = peers_.find(member);
      if (it == peers_.end() || it->second.state == Peer::State::kFailed) return false;
      if (it->second.lastPong >= sent) return true;
      serviceLanesAsGuestLocked();
      mu_.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      mu_.lock();
    }
  }
  failPeerLocked(member, ecclTimeout,
                 fmt::format("peer {} did not {} before the deadline and does not answer (timed out; stopped "
                             "or hung process?)",
                             labelLocked(member), sending ? "accept our data" : "send its data"),
                 true);
  return false;
}

}  // namespace eccl::transport::lanes
