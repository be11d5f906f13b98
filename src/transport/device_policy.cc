#include "transport/lane_device.h"

namespace eccl::transport::lanes {

bool LaneDevice::pingLocked(MemberId member, uint64_t seq) {
  auto it = peers_.find(member);
  if (it == peers_.end() || it->second.lanes.empty() || !it->second.lanes[0]->conduit) return false;
  std::vector<uint8_t> payload;
  if (seq != 0 && FrameHeader::isCollective(seq) && signatures_.mine(epoch_, seq)) {
    payload.resize(8);
    std::memcpy(payload.data(), &seq, 8);
  }
  queueControlLocked(*it->second.lanes[0], FrameType::kPing, std::move(payload));
  return true;
}

bool LaneDevice::checkAlive(MemberId member, int64_t silentMs) {
  MutexLock lock(mu_);
  auto it = peers_.find(member);
  if (it == peers_.end()) return false;
  Peer& p = it->second;
  if (p.state == Peer::State::kFailed || p.state == Peer::State::kLeft) return false;
  if (p.state != Peer::State::kUp) return true;  // a dial has its own deadline
  const auto now = Clock::now();
  const auto quarter = std::chrono::milliseconds(std::max<int64_t>(silentMs / 4, 1));
  if (p.pingSent != Clock::time_point{} && p.lastPong >= p.pingSent) p.pingSent = {};
  if (p.pingSent == Clock::time_point{}) {
    if (now - p.lastPong >= quarter && pingLocked(member)) p.pingSent = now;
    return true;
  }
  if (now - p.pingSent < 3 * quarter) return true;
  failPeerLocked(member, ecclTimeout,
                 fmt::format("peer {} does not answer (no reply to a liveness ping for {} ms: stopped or hung process?)",
                             p.label, std::chrono::duration_cast<std::chrono::milliseconds>(now - p.pingSent).count()),
                 true);
  return false;
}

// A ping that names a collective asks what the peer called there: two ranks
// that disagree without sending each other anything (both think they are
// the root of a reduce) learn it at the deadline instead of declaring a
// live peer failed.
void LaneDevice::answerPingLocked(Lane& lane) {
  std::vector<uint8_t> payload;
  if (lane.control.size() == 8) {
    uint64_t seq;
    std::memcpy(&seq, lane.control.data(), 8);
    payload.assign(lane.control.begin(), lane.control.end());
    if (auto mine = signatures_.mine(lane.frame.epoch, seq); mine && lane.frame.epoch == epoch_) {
      payload.resize(8 + CallSignature::kWireBytes);
      encodeSignature(*mine, payload.data() + 8);
    }
  }
  queueControlLocked(lane, FrameType::kPong, std::move(payload));
}

void LaneDevice::onPongSignatureLocked(Lane& lane) {
  if (lane.control.size() != 8 + CallSignature::kWireBytes || lane.frame.epoch != epoch_) return;
  uint64_t seq;
  std::memcpy(&seq, lane.control.data(), 8);
  auto mine = signatures_.mine(epoch_, seq);
  auto theirs = decodeSignature(lane.control.data() + 8, nullptr);
  if (mine && theirs && !signaturesAgree(*mine, *theirs)) callMismatchLocked(lane.key.remote, seq, *mine, *theirs);
}

bool LaneDevice::revokesLocked(uint64_t seq) const {
  if (revokedCode_ == ecclSuccess || FrameHeader::survivesRevocation(seq)) return false;
  return !(FrameHeader::isCollective(seq) && seq < revokedFromSeq_);
}

void LaneDevice::revokeLocked(ecclResult_t code, const std::string& reason, uint64_t fromSeq) {
  if (revokedCode_ != ecclSuccess) return;
  eventLocked();
  revokedCode_ = code;
  revokedReason_ = reason;
  revokedFromSeq_ = fromSeq;
  failOpsLocked([this](uint64_t seq) ECCL_REQUIRES(mu_) { return revokesLocked(seq); }, code, reason);
}

void LaneDevice::failOpsLocked(const std::function<bool(uint64_t seq)>& dies, ecclResult_t code,
                               const std::string& reason) {
  // Failed sends must never read their buffers again: drop queued data
  // frames. A half-written one is finished from a private copy of its tail,
  // so the lane stays whole and is inherited by the next view (the receiver
  // discards the frame as part of a dead op).
  // A zero-copy chunk whose header went out is still sent when cleared,
  // from the pinned pages or a copy.
  for (auto& [id, p] : peers_) {
    for (auto& lane : p.lanes) {
      std::deque<SendItem> keep;
      for (auto& item : lane->sendQueue) {
        if (!item.request || !dies(item.request->seq)) {
          keep.push_back(std::move(item));
          continue;
        }
        completeLocked(item.request, code, reason);
        if (item.done > 0) {  // torn
          item.detach();
          keep.push_back(std::move(item));
        }
      }
      lane->sendQueue = std::move(keep);
      for (auto item = lane->bulk.waiting().begin(); item != lane->bulk.waiting().end();) {  // none started
        if (!item->request || !dies(item->request->seq)) {
          ++item;
          continue;
        }
        completeLocked(item->request, code, reason);
        item = lane->bulk.waiting().erase(item);
      }
      for (SendItem& item : lane->rendezvous.awaitingClearance)
        if (item.request && dies(item.request->seq)) completeLocked(item.request, code, reason), item.detach();
      for (SendItem& item : lane->rendezvous.writes)  // written from the pinned pages
        if (item.request && dies(item.request->seq))
          completeLocked(item.request, code, reason), item.request.reset();
    }
  }
  // Buffers of failed receives must never be written again.
  for (auto box = messages_.begin(); box != messages_.end();) {
    bool dropped = box->second.request && dies(box->second.request->seq);
    box = dropped ? dropBoxLocked(box, code, reason) : std::next(box);
  }
  discardOrphanedPayloadsLocked();
}

void LaneDevice::floodRevokeLocked(ecclResult_t code, const std::string& reason, uint64_t fromSeq) {
  std::vector<uint8_t> payload(12 + reason.size());
  std::memcpy(payload.data(), &fromSeq, 8);
  auto c = static_cast<uint32_t>(code);
  std::memcpy(payload.data() + 8, &c, 4);
  std::memcpy(payload.data() + 12, reason.data(), reason.size());
  floodControlLocked(FrameType::kRevoke, std::move(payload), std::nullopt);
}

// Every copy is queued before any is written: writing to a peer that has
// gone fails that peer, whose own notice must then come second.
void LaneDevice::floodControlLocked(FrameType type, std::vector<uint8_t> payload, std::optional<MemberId> except) {
  if (payload.size() > FrameHeader::kMaxControlPayload) payload.resize(FrameHeader::kMaxControlPayload);
  std::vector<Lane*> queued;
  for (auto& [id, other] : peers_) {
    if (id == except || other.state == Peer::State::kFailed || other.lanes.empty() ||
        other.role == PeerRole::kCandidate)
      continue;
    Lane& lane = *other.lanes[0];
    if (!lane.conduit) continue;
    queueControlLocked(lane, type, payload, /*flush=*/false);
    queued.push_back(&lane);
  }
  for (Lane* lane : queued) flushLocked(*lane);
}

void LaneDevice::refusedLocked(uint64_t seq, const std::string& reason, std::optional<MemberId> from) {
  if (!FrameHeader::isCollective(seq) || !refusedOps_.emplace(seq, reason).second) return;  // known: not again
  eventLocked();
  log::warn("member {}: {}", opt_.self, reason);
  failOpsLocked([seq](uint64_t s) { return s == seq; }, ecclInvalidUsage, reason);
  dropRefusedMessagesLocked(seq);
  // On to every connected peer (a view's links connect it): a rank that
  // never exchanges with the refuser waits on one that does.
  std::vector<uint8_t> payload(8 + reason.size());
  std::memcpy(payload.data(), &seq, 8);
  std::memcpy(payload.data() + 8, reason.data(), reason.size());
  floodControlLocked(FrameType::kRefused, std::move(payload), from);
  // Our call of that op already returned success (a root whose sends
  // completed): later than its posts, and still news to this rank. Where
  // the call is still running, collectiveEnds decides.
  const bool ended = seq < calls_.latest || (seq == calls_.latest && !calls_.running);
  if (from && ended && !calls_.failed.count(seq)) refusedAfterSuccessLocked(seq, reason);
}

void LaneDevice::refusedAfterSuccessLocked(uint64_t seq, const std::string& reason) {
  // Carried by the next call to start, never by one running: refused at
  // its start, that call posts nothing, so it fails at every rank that
  // needs this one's part, and ranks stay matched.
  std::string late = fmt::format("{}'s part of collective op {} (epoch {}) had completed when it heard: {}",
                                 selfLabel_.empty() ? "this member" : selfLabel_, seq, epoch_, reason);
  calls_.lateRefusal = calls_.lateRefusal ? fmt::format("{}; and {}", *calls_.lateRefusal, late) : late;
}

std::optional<std::string> LaneDevice::collectiveStarts(uint64_t seq, const CallSignature* signature,
                                                        uint64_t endedWell) {
  MutexLock lock(mu_);
  if (endedWell) collectiveEndsLocked(endedWell, true);
  calls_.latest = std::max(calls_.latest, seq);
  calls_.running = true;
  // Refused by someone already: every rank fails this op, so the late news
  // need not travel to keep them matched; it is this member's to hear.
  if (const std::string* refused = refusalOfLocked(seq)) {
    std::string why = *refused;
    if (calls_.lateRefusal) why = fmt::format("{} (and {})", why, *calls_.lateRefusal);
    calls_.lateRefusal.reset();
    return why;
  }
  if (!calls_.lateRefusal) {
    if (signature) checkLocalSignatureLocked(seq, *signature);
    return std::nullopt;
  }
  std::string reason = fmt::format("{} refused its part of collective op {} (epoch {}): {}",
                                   selfLabel_.empty() ? "this member" : selfLabel_, seq, epoch_, *calls_.lateRefusal);
  calls_.lateRefusal.reset();
  refusedLocked(seq, reason, std::nullopt);
  return reason;
}

void LaneDevice::collectiveEnds(uint64_t seq, bool ok) {
  MutexLock lock(mu_);
  collectiveEndsLocked(seq, ok);
}

void LaneDevice::collectiveEndsLocked(uint64_t seq, bool ok) {
  if (seq == calls_.latest) calls_.running = false;
  if (!ok) {
    calls_.failed.insert(seq);
    return;
  }
  if (const std::string* refused = refusalOfLocked(seq)) refusedAfterSuccessLocked(seq, *refused);
}

// What peers already sent for a refused op is never asked for: whole
// messages go now, partial ones are read to their end and dropped.
void LaneDevice::dropRefusedMessagesLocked(uint64_t seq) {
  for (auto it = messages_.begin(); it != messages_.end();) {
    Inbox& box = it->second;
    if (it->first.seq != seq || it->first.epoch != epoch_ || box.request || box.cancelled || box.exposed > 0) {
      ++it;
      continue;
    }
    stats_.refusedBytesDropped += box.received;
    messages_.releaseStaging(box);
    box.cancelled = true;
    // A lane in the middle of its frame drops the rest: the whole frame is
    // counted now (the header came; later frames count as they arrive).
    for (auto& [token, lane] : lanesByToken_) {
      if (lane->rx != Lane::Rx::kPayload || lane->discarding || !(lane->inboxKey == it->first)) continue;
      lane->discarding = true;
      box.received += lane->frame.length;
      stats_.refusedBytesDropped += lane->frame.length;
    }
    it = box.received >= box.total ? messages_.erase(it) : std::next(it);
  }
}

const std::string* LaneDevice::refusalOfLocked(uint64_t seq) const {
  auto it = refusedOps_.find(seq);
  return it == refusedOps_.end() ? nullptr : &it->second;
}

// Each collective enters this rank's signature as it starts; a peer's
// frame that got here first is compared now.
void LaneDevice::checkLocalSignatureLocked(uint64_t seq, const CallSignature& mine) {
  if (seq == lastCheckedSeq_) return;
  lastCheckedSeq_ = seq;
  if (auto m = signatures_.local(epoch_, seq, mine)) callMismatchLocked(m->peer, seq, mine, m->theirs);
}

// Ranks disagree about a call: from this op on the communicator is
// revoked with ecclInvalidUsage naming both calls, here and everywhere
// (the ranks that agreed would otherwise wait for data that never comes).
// A send/recv pair has no place among the collectives: every send and
// receive fails, and the collectives from the next this rank would start
// (one it already started may still be finishing on a slower rank).
void LaneDevice::callMismatchLocked(MemberId peer, uint64_t seq, const CallSignature& mine,
                                   const CallSignature& theirs) {
  if (revokedCode_ != ecclSuccess) return;  // revoked already, for a reason that came first
  bool collective = FrameHeader::isCollective(seq);
  std::string reason = fmt::format("ranks disagree about {} (epoch {}): {} called {}, {} called {}",
                                   collective ? fmt::format("collective op {}", seq) : std::string("a send/recv pair"),
                                   epoch_, selfLabel_, describe(mine), labelLocked(peer), describe(theirs));
  log::warn("{}", reason);
  uint64_t fromSeq = collective ? seq : lastCheckedSeq_ + 1;
  revokeLocked(ecclInvalidUsage, reason, fromSeq);
  floodRevokeLocked(ecclInvalidUsage, reason, fromSeq);
  if (onRevoked) onRevoked(ecclInvalidUsage, reason);
}

void LaneDevice::discardOrphanedPayloadsLocked() {
  for (auto& [token, lane] : lanesByToken_)
    if (lane->rx == Lane::Rx::kPayload && lane->frame.type == FrameType::kData && !messages_.contains(lane->inboxKey))
      lane->discarding = true;
}

// Everything a failing member wrote before it went is read before the
// failure is applied, on every lane: a peer that completed its part and
// exited leaves its last frames (a receive's data) in lanes other than the
// one that saw it close, and a notice from the coordinator can come before
// any of them. With mayWait (the caller may let the lock go), a lane
// another thread copies from with the lock released (a payload straight
// into its receive buffer) is waited for, or its message would fail half
// copied; and a lane whose bytes trail the peer's writes (a socket) is read
// until it closes or stays quiet for kQuiet. A pass of readLocked stops
// early once a foreground request completes, so a lane is read until it is
// empty. Bounded: a member judged failed while alive may still be writing,
// and a copy that never ends must not hold the verdict back.
void LaneDevice::readWhatFailedPeerSentLocked(MemberId member, bool mayWait) {
  constexpr int kMaxPassesPerLane = 64;
  constexpr auto kQuiet = std::chrono::milliseconds(20);
  const Deadline deadline = Clock::now() + std::chrono::seconds(2);
  auto peer = [&]() ECCL_REQUIRES(mu_) -> Peer* {
    auto it = peers_.find(member);
    return it == peers_.end() || it->second.state == Peer::State::kFailed ? nullptr : &it->second;
  };
  auto pause = [&](std::chrono::milliseconds slice) ECCL_REQUIRES(mu_) {
    copyWaiters_++;  // a copy that ends wakes us
    cv_.waitUntil(mu_, std::min(deadline, Clock::now() + slice));
    copyWaiters_--;
  };
  Peer* p = peer();
  while (mayWait && p && p->drainingLanes && Clock::now() < deadline) {  // another thread drains it: let it finish
    pause(std::chrono::milliseconds(10));
    p = peer();
  }
  if (!p || p->drainingLanes) return;
  p->drainingLanes = true;
  const bool foregroundBefore = foregroundCompleted_;
  bool foregroundDuring = false;
  for (size_t i = 0; p && i < p->lanes.size(); ++i) {
    Clock::time_point lastBytes = Clock::now();
    for (int pass = 0; pass < kMaxPassesPerLane; ++pass) {
      const bool mayPause = mayWait && Clock::now() < deadline;
      if (p->lanes[i]->reading && mayPause) {
        pause(std::chrono::milliseconds(10));
        if (!(p = peer()) || i >= p->lanes.size()) break;
        continue;
      }
      Lane& lane = *p->lanes[i];
      if (!lane.conduit || lane.reading) break;
      foregroundCompleted_ = false;
      bool drained = false;
      const uint64_t before = stats_.bytesReceived;
      const bool open = readLocked(lane, /*mayUnlock=*/false, &drained);
      foregroundDuring = foregroundDuring || foregroundCompleted_;
      if (!open) break;
      if (stats_.bytesReceived != before) lastBytes = Clock::now();
      if (!drained) continue;
      if (!mayPause || !lane.conduit->bytesTrailWrites() || Clock::now() - lastBytes >= kQuiet) break;
      pause(std::chrono::milliseconds(2));
      if (!(p = peer()) || i >= p->lanes.size()) break;
    }
  }
  foregroundCompleted_ = foregroundBefore || foregroundDuring;
  // Cleared even on a peer failed meanwhile: a later incarnation under the
  // same entry must see its own end of file.
  if (auto it = peers_.find(member); it != peers_.end()) it->second.drainingLanes = false;
  if (mayWait) cv_.notifyAll();
}

void LaneDevice::failPeerLocked(MemberId member, ecclResult_t code, const std::string& reason, bool flood,
                                uint64_t fromSeq, FailureEvidence evidence) {
  auto it = peers_.find(member);
  if (it == peers_.end()) return;
  Peer& p = it->second;
  if (p.state == Peer::State::kFailed) return;
  // Someone's collective fromSeq needed a member that left in order: not a
  // failure of its connections, where its goodbye still follows the last
  // data it sent for the ops before that one (a slower rank's receive of
  // it may still be on its way).
  if (fromSeq > 0) {
    log::warn("member {}: {}", opt_.self, reason);
    leftPeerNeededLocked(p, fromSeq, reason, flood);
    return;
  }
  bool wasLeft = p.state == Peer::State::kLeft;
  eventLocked();
  p.state = Peer::State::kFailed;
  p.failCode = code;
  p.failReason = reason;
  cv_.notifyAll();  // connectNow may be waiting for this peer to dial us
  log::warn("member {}: {}", opt_.self, reason);
  for (auto& lane : p.lanes) {
    failLaneSendsLocked(*lane, code, reason);
    closeLaneLocked(*lane);
  }
  p.receiveReady.clear();
  for (auto box = messages_.begin(); box != messages_.end();) {
    // A whole message that came before the failure, not yet asked for, is
    // kept: the op it belongs to may be one the failure does not revoke.
    bool arrived = !box->second.request && box->second.received == box->second.total;
    if (box->first.peer != member || arrived) {
      ++box;
      continue;
    }
    if (box->second.request) completeLocked(box->second.request, code, reason);
    box = messages_.erase(box);
  }
  // Nothing is anyone's failure once we are closing ourselves. A peer that
  // left in order is nobody's failure either, until someone says otherwise:
  // a notice about it (the coordinator's, or a peer's that needed it) means
  // the view is broken, and ops waiting on others must end too.
  if (closing_ || (wasLeft && !flood)) return;
  if (p.role == PeerRole::kCandidate) {
    candidateFailed_.insert(member);
    cv_.notifyAll();
    return;  // not in the view: the coordinator decides what its loss means
  }
  if (onPeerFailure) onPeerFailure(member, code, reason, 0, evidence);
  revokeLocked(code == ecclTimeout ? ecclTimeout : ecclRemoteError, reason, 0);
  if (flood) floodNoticeLocked(member, reason, 0);
}

// Tells everyone we are connected to, so ranks that wait on a live
// neighbour of the failed member learn its name at once.
void LaneDevice::floodNoticeLocked(MemberId member, const std::string& reason, uint64_t fromSeq) {
  std::vector<uint8_t> payload(16 + reason.size());
  std::memcpy(payload.data(), &member, 8);
  std::memcpy(payload.data() + 8, &fromSeq, 8);
  std::memcpy(payload.data() + 16, reason.data(), reason.size());
  floodControlLocked(FrameType::kNotice, std::move(payload), member);
}

void LaneDevice::markLeftLocked(Peer& p) {
  // A lane the peer opened but we have not accepted yet still carries data.
  bool allSaid = std::all_of(p.lanes.begin(), p.lanes.end(),
                             [](auto& l) { return l->saidGoodbye || (l->opened && !l->conduit); });
  if (!allSaid || p.state == Peer::State::kFailed) return;
  std::string reason = fmt::format("peer {} has left (it destroyed its communicator)", p.label);
  for (auto& lane : p.lanes) {
    failLaneSendsLocked(*lane, ecclRemoteError, reason);
    closeLaneLocked(*lane);
  }
  cv_.notifyAll();
  if (p.state == Peer::State::kLeft) return;
  eventLocked();
  p.state = Peer::State::kLeft;
  p.failCode = ecclRemoteError;
  p.failReason = reason;
  // Its goodbye followed its last data on every lane, so whole messages it
  // sent before leaving stay receivable; only what can never arrive fails.
  std::optional<uint64_t> neededFrom;
  for (auto box = messages_.begin(); box != messages_.end();) {
    bool lost = box->first.peer == p.id && box->second.received < box->second.total;
    if (lost && box->second.request) {
      completeLocked(box->second.request, ecclRemoteError, reason);
      uint64_t seq = FrameHeader::isCollective(box->first.seq) ? box->first.seq : 0;
      if (!FrameHeader::isBackground(box->first.seq)) neededFrom = std::min(neededFrom.value_or(seq), seq);
    }
    box = lost ? messages_.erase(box) : std::next(box);
  }
  if (neededFrom) leftPeerNeededLocked(p, *neededFrom, p.failReason, /*flood=*/true);
}

// An op needed a member that left in order (mid-job, not at its end): the
// view is broken like after a failure, and everyone must hear it, or ranks
// waiting on us wait for the deadline. But only from that op on: the member
// finished every op before it (it left after them), so a slower rank still
// completing one of those must not lose it. A send or receive that needed
// it breaks everything (point-to-point traffic has no such order).
void LaneDevice::leftPeerNeededLocked(Peer& p, uint64_t fromSeq, const std::string& reason, bool flood) {
  if (p.leftReported || closing_ || p.role == PeerRole::kCandidate) return;
  p.leftReported = true;
  eventLocked();
  if (onPeerFailure) onPeerFailure(p.id, ecclRemoteError, reason, fromSeq, FailureEvidence::kObserved);
  revokeLocked(ecclRemoteError, reason, fromSeq);
  if (flood) floodNoticeLocked(p.id, reason, fromSeq);
}

void LaneDevice::queueControlLocked(Lane& lane, FrameType type, std::vector<uint8_t> payload, bool flush) {
  SendItem item;
  FrameHeader h;
  h.type = type;
  h.epoch = epoch_;
  h.commId = opt_.commId;
  h.length = static_cast<uint32_t>(payload.size());
  encodeFrame(h, item.header);
  item.owned = std::move(payload);
  item.data = item.owned.data();
  item.length = item.owned.size();
  lane.sendQueue.push_back(std::move(item));
  // The deque keeps elements in place, so data keeps pointing at owned.
  if (flush) flushLocked(lane);
}

// A member that destroys its communicator says which collectives it made
// last: a peer still in one of them, which it may never have sent anything
// for (the root of a broadcast against an allreduce), names the
// disagreement instead of taking its departure for the failure.
std::vector<uint8_t> LaneDevice::goodbyePayloadLocked() const {
  std::vector<uint8_t> out;
  for (const auto& [seq, signature] : signatures_.recent(epoch_)) {
    const size_t at = out.size();
    out.resize(at + 8 + CallSignature::kWireBytes);
    std::memcpy(out.data() + at, &seq, 8);
    encodeSignature(signature, out.data() + at + 8);
  }
  return out;
}

void LaneDevice::checkGoodbyeSignaturesLocked(Lane& lane) {
  if (lane.frame.epoch != epoch_) return;
  constexpr size_t kEntry = 8 + CallSignature::kWireBytes;
  for (size_t at = 0; at + kEntry <= lane.control.size(); at += kEntry) {
    uint64_t seq;
    std::memcpy(&seq, lane.control.data() + at, 8);
    std::string why;
    auto theirs = decodeSignature(lane.control.data() + at + 8, &why);
    if (!theirs || !FrameHeader::isCollective(seq)) continue;
    if (auto m = signatures_.remote(epoch_, seq, lane.key.remote, *theirs))
      return callMismatchLocked(lane.key.remote, seq, m->mine, m->theirs);
  }
}

void LaneDevice::onControlLocked(Lane& lane) {
  MemberId remote = lane.key.remote;
  Peer& p = peers_[remote];
  if (lane.frame.type == FrameType::kGoodbye) {
    checkGoodbyeSignaturesLocked(lane);
    lane.saidGoodbye = true;
    markLeftLocked(p);
    return;
  }
  switch (lane.frame.type) {
    case FrameType::kPing: return answerPingLocked(lane);
    case FrameType::kClearToSend: return onClearToSendLocked(lane);
    case FrameType::kLanded: return onLandedLocked(lane);
    case FrameType::kReceiveReady: return onReceiveReadyLocked(lane);
    case FrameType::kReceiveDone: return onReceiveDoneLocked(lane);
    case FrameType::kReceiveReleased: return onReceiveReleasedLocked(lane);
    case FrameType::kBulkRead: return onBulkReadLocked(lane);
    default: break;
  }
  if (lane.frame.type == FrameType::kPong) {
    p.lastPong = Clock::now();
    onPongSignatureLocked(lane);
    cv_.notifyAll();
    return;
  }
  if (lane.frame.type == FrameType::kRefused) {
    uint64_t seq;
    std::memcpy(&seq, lane.control.data(), 8);
    if (lane.frame.epoch != epoch_) return;  // another view's op
    refusedLocked(seq, std::string(reinterpret_cast<char*>(lane.control.data()) + 8, lane.control.size() - 8),
                  remote);
    return;
  }
  if (lane.frame.type == FrameType::kRevoke) {
    uint64_t fromSeq;
    uint32_t code;
    std::memcpy(&fromSeq, lane.control.data(), 8);
    std::memcpy(&code, lane.control.data() + 8, 4);
    std::string reason(reinterpret_cast<char*>(lane.control.data()) + 12, lane.control.size() - 12);
    if (lane.frame.epoch != epoch_ || revokedCode_ != ecclSuccess) return;  // another view's, or known
    auto result = code > ecclSuccess && code < ecclNumResults ? static_cast<ecclResult_t>(code) : ecclRemoteError;
    std::string why = fmt::format("{} (heard from {})", reason, p.label);
    revokeLocked(result, why, fromSeq);
    floodRevokeLocked(result, reason, fromSeq);
    if (onRevoked) onRevoked(result, why);
    return;
  }
  MemberId failed;  // the frame decoder checked the 16 bytes are there
  uint64_t fromSeq;
  std::memcpy(&failed, lane.control.data(), 8);
  std::memcpy(&fromSeq, lane.control.data() + 8, 8);
  std::string reason(reinterpret_cast<char*>(lane.control.data()) + 16, lane.control.size() - 16);
  if (failed == opt_.self) {
    log::warn("peer {} reports this member failed: {}", p.label, reason);
    return;
  }
  auto it = peers_.find(failed);
  if (it == peers_.end() || it->second.state == Peer::State::kFailed) return;
  failPeerLocked(failed, ecclRemoteError,
                 fmt::format("peer {} failed (reported by {}: {})", it->second.label, p.label, reason), true, fromSeq);
}

}  // namespace eccl::transport::lanes
