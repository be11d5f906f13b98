#include "transport/lane_device.h"

#include "common/copy.h"

namespace eccl::transport::lanes {

// Reads and writes whatever the lanes are ready for, without blocking.
void LaneDevice::serviceLanesLocked(bool sockets) {
  foregroundCompleted_ = false;
  epoll_event events[64];
  int n = sockets ? epoll_wait(laneEpoll_.get(), events, 64, 0) : 0;
  for (int i = 0; i < n; ++i) {
    uint64_t token = events[i].data.u64;
    auto it = lanesByToken_.find(token);
    if (it == lanesByToken_.end()) continue;  // closed since epoll_wait returned
    Lane& lane = *it->second;
    const bool readable = events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR);
    // A lane another thread reads (lock released) is its: it comes back.
    const bool readHere = readable && !lane.reading;
    if (readHere) lane.conduit->onPollReady();
    if ((events[i].events & EPOLLOUT) || (readable && !lane.conduit->writableByPoll())) flushLocked(lane);
    if (lane.token == token && readHere) readLocked(lane, /*mayUnlock=*/true);
  }
  // Lanes in memory announce nothing while their peer is awake: look.
  for (size_t i = 0; i < memoryLanes_.size(); ++i) {
    Lane& lane = *memoryLanes_[i];
    const uint64_t token = lane.token;
    // A cleared zero-copy write the peer waits for goes before the read
    // (which may copy megabytes in) and after it (what it cleared). Each
    // step that may release the lock says whether `lane` is still there.
    if (lane.hasSends()) flushLocked(lane);
    bool alive = writeHeldIfDueLocked(lane);
    if (alive && lane.token == token && lane.conduit && !lane.reading) alive = readLocked(lane, /*mayUnlock=*/true);
    if (alive) writeHeldIfDueLocked(lane);
    if (i < memoryLanes_.size() && memoryLanes_[i] != &lane) --i;  // closed meanwhile (`lane` may be gone)
  }
}

// Before sleeping: every lane in memory must ring the lanes' descriptors
// for whatever comes next; false when something is there already.
bool LaneDevice::armLanesLocked() {
  for (Lane* lane : memoryLanes_) {
    // Being read by another thread, lock released: its ring may hold more,
    // which that thread reads next, but nothing rings for it meanwhile.
    if (lane->reading) return false;
    if (!lane->conduit->armWakeup(lane->wantsRoom())) return false;
    if (lane->bulk.heldBack() && !lane->conduit->armBulkWakeup()) return false;
    // armWakeup looks at the completions once more after arming: a
    // zero-copy write it saw finish raises no event of its own.
    if (zeroCopyWriteFinishedLocked(*lane) || lane->rendezvous.heldBack) return false;
  }
  return true;
}

bool LaneDevice::rdmaInFlightLocked() const {
  for (const Lane* lane : memoryLanes_)
    if (lane->rendezvous.busy()) return true;
  return false;
}

void LaneDevice::completeLocked(const RequestPtr& r, ecclResult_t code, std::string error) {
  if (r->state.load() != Request::kPending) return;
  if (r->unlockedCopies > 0) {  // a lane writes its buffer now: completed once that read returns
    if (!r->heldCompletion) r->heldCompletion.emplace(code, std::move(error));
    return;
  }
  r->code = code;
  r->error = std::move(error);
  r->state.store(code == ecclSuccess ? Request::kDone : Request::kFailed);
  if (!FrameHeader::isBackground(r->seq)) foregroundCompleted_ = true;
  cv_.notifyAll();
  if (r->driverWakeFd >= 0 && r->driverWakeFd != threadWakeFd()) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t rc = ::write(r->driverWakeFd, &one, sizeof(one));
  }
}

// Frames first (a clear-to-send the peer waits for among them), then one
// cleared zero-copy write, then its kLanded, which must follow it. While
// the lane is being read no write starts: readLocked starts one once every
// frame that came is answered.
void LaneDevice::flushLocked(Lane& lane) { flushLocked(lane, !lane.reading); }

void LaneDevice::flushLocked(Lane& lane, bool startWrite) {
  if (!lane.rendezvous.writes.empty()) reapZeroCopyWritesLocked(lane);
  if (!writeQueuedLocked(lane)) return;
  if (startWrite && lane.conduit && startZeroCopyWriteLocked(lane) && !writeQueuedLocked(lane)) return;
  // A write whose notice just went out completes now, not a pass later.
  if (!lane.rendezvous.writes.empty()) reapZeroCopyWritesLocked(lane);
  setWantOutLocked(lane, lane.streamWantsRoom());
}

// Writes queued frames while the conduit takes them; false when the lane
// failed (its peer is failed and the lane closed).
bool LaneDevice::writeQueuedLocked(Lane& lane) {
  // A few bulk frames per call at most: the rest goes on the lane's later
  // writability events, so a bulk message never holds the device (and the
  // posts of other threads) for its whole length, and the lane is not
  // woken once per frame either.
  size_t bulkFrames = 0;
  lane.bulk.beginPass();
  while (lane.conduit) {
    if (lane.sendQueue.empty()) {
      if (lane.bulk.empty() || bulkFrames == kBulkFramesPerFlush) break;
      std::optional<SendItem> next =
          lane.bulk.admit(*lane.conduit, Clock::now(), std::chrono::milliseconds(opt_.bulkQuietAfterMs));
      if (!next) break;
      bulkFrames++;
      lane.sendQueue.push_back(std::move(*next));
      // Counted unless it goes to a process outside the view: a standby's
      // sandbox sends nothing, not even a report of what it read.
      SendItem& admitted = lane.sendQueue.back();
      if (!lane.conduit->seesPeerReads() && !FrameHeader::isOutOfView(admitted.request->seq))
        markRendezvous(admitted.header, true, FrameHeader::kBulkCredit);
    }
    SendItem& item = lane.sendQueue.front();
    if (item.done == 0 && item.request && opt_.zeroCopy && !item.rendezvous) {
      const size_t least = lane.conduit->zeroCopyMinBytes();
      if (least > 0 && item.length >= least && takeReceiveReadyLocked(lane, item)) {
        // The receiver announced where: written like a cleared chunk, its
        // header after it (startZeroCopyWriteLocked).
        lane.rendezvous.writes.push_back(std::move(item));
        lane.sendQueue.pop_front();
        lane.rendezvous.heldBack = true;
        continue;
      }
      if (least > 0 && item.length >= least && (item.pinned = lane.conduit->pin(item.data, item.length))) {
        item.rendezvous = true;
        item.pinnedFrom = item.data;
        markRendezvous(item.header, true);
      }
    }
    const size_t wireBytes = item.headerBytes + (item.rendezvous ? 0 : item.length);
    iovec iov[2];
    int n = 0;
    if (item.done < item.headerBytes) {
      iov[n++] = {item.header + item.done, item.headerBytes - item.done};
      if (item.length && !item.rendezvous) iov[n++] = {const_cast<uint8_t*>(item.data), item.length};
    } else {
      size_t off = item.done - item.headerBytes;
      iov[n++] = {const_cast<uint8_t*>(item.data) + off, item.length - off};
    }
    ssize_t rc = lane.conduit->write(iov, n);
    // A conduit says "nothing fits" with 0; one that says it as the
    // system call would (EAGAIN, EINTR) is not broken either.
    if (rc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) rc = 0;
    if (rc == 0) {
      if (item.rendezvous && item.done == 0) {  // pinned only while its header is on the way
        lane.conduit->release(item.pinned);
        item.pinned = 0;
        item.rendezvous = false;
        markRendezvous(item.header, false);
      }
      break;
    }
    if (rc < 0) {
      const int error = errno;
      const std::string failure = lane.conduit->failure();
      const std::string why = failure.empty() ? strerror(error) : failure;
      // What the peer sent before it went is read first: a peer that gave
      // up after another member failed has usually told us which one, and
      // that member, not this peer, is what every rank must name.
      if (!lane.reading) readLocked(lane);
      if (lane.conduit && lane.saidGoodbye) {
        // It closed this lane in order (it left, or switched over to a
        // view without this member): what we still had for it is not
        // wanted, and nobody failed.
        failLaneSendsLocked(lane, ecclRemoteError,
                            fmt::format("peer {} closed lane {} in order", labelLocked(lane.key.remote), lane.key.lane));
        closeLaneLocked(lane);
        markLeftLocked(peers_[lane.key.remote]);
        return false;
      }
      const bool closed = failure.empty() && (error == ECONNRESET || error == EPIPE);
      if (lane.conduit)
        failPeerLocked(lane.key.remote, ecclRemoteError,
                       fmt::format("peer {}: send on lane {} failed: {}", labelLocked(lane.key.remote),
                                   lane.key.lane, why),
                       true, 0, closed ? FailureEvidence::kPeerClosed : FailureEvidence::kObserved);
      return false;
    }
    item.done += static_cast<size_t>(rc);
    stats_.bytesSent += static_cast<size_t>(rc);
    if (item.done < wireBytes) break;
    if (item.rendezvous) {
      lane.rendezvous.awaitingClearance.push_back(std::move(item));
      lane.sendQueue.pop_front();
      continue;
    }
    if (item.header[7] & FrameHeader::kBulkCredit) lane.bulk.credit().sent(item.length);
    if (item.notice) lane.rendezvous.noticesWritten = std::max(lane.rendezvous.noticesWritten, item.notice);
    RequestPtr r = std::move(item.request);
    lane.sendQueue.pop_front();
    finishChunkLocked(r);
  }
  return true;
}

// A bulk frame the sender counts was read (its payload kept or dropped):
// count it, and report the count every BulkCredit::kReportBytes.
void LaneDevice::bulkFrameReadLocked(Lane& lane) {
  const std::optional<uint64_t> total = lane.bulk.credit().read(lane.frame.length);
  if (!total) return;
  std::vector<uint8_t> payload(8);
  std::memcpy(payload.data(), &*total, 8);
  queueControlLocked(lane, FrameType::kBulkRead, std::move(payload));
}

void LaneDevice::onBulkReadLocked(Lane& lane) {
  uint64_t read;
  std::memcpy(&read, lane.control.data(), 8);  // the frame decoder checked the 8 bytes are there
  if (!lane.bulk.credit().peerRead(read)) {
    stats_.framesRejected++;
    failPeerLocked(lane.key.remote, ecclRemoteError,
                   fmt::format("peer {} said it read {} bytes of bulk frames on lane {}, of {} sent; connection "
                               "dropped",
                               labelLocked(lane.key.remote), read, lane.key.lane, lane.bulk.credit().sentTotal()),
                   true);
    return;
  }
  if (!lane.bulk.empty()) flushLocked(lane);
}

RequestPtr LaneDevice::newRequest(MemberId member, uint64_t seq, bool isSend) {
  auto r = std::make_shared<Request>();
  r->peer = member;
  r->seq = seq;
  r->isSend = isSend;
  r->survivesRevocation = FrameHeader::survivesRevocation(seq);
  return r;
}

// A post to a member that failed or left fails at once; needing a member
// that left in order breaks the view like a failure.
bool LaneDevice::failIfPeerGoneLocked(const RequestPtr& r, Peer& p) {
  if (p.state != Peer::State::kFailed && p.state != Peer::State::kLeft) return false;
  completeLocked(r, p.failCode, p.failReason);
  if (p.state == Peer::State::kLeft && !r->survivesRevocation && !FrameHeader::isBackground(r->seq))
    leftPeerNeededLocked(p, FrameHeader::isCollective(r->seq) ? r->seq : 0, p.failReason, /*flood=*/true);
  return true;
}

RequestPtr LaneDevice::postSend(MemberId member, uint64_t seq, uint32_t tag, const void* buf, size_t len,
                               const uint32_t* payloadCrc, const CallSignature* signature, bool bulk) {
  connectPeer(member);
  RequestPtr r = newRequest(member, seq, /*isSend=*/true);
  r->bytes = len;
  MutexLock lock(mu_);
  Peer& p = peerLocked(member);
  if (aborted_) {
    completeLocked(r, ecclRemoteError, abortReason_);
    return r;
  }
  if (revokesLocked(seq)) {
    completeLocked(r, revokedCode_, revokedReason_);
    return r;
  }
  if (const std::string* refused = refusalOfLocked(seq)) {
    completeLocked(r, ecclInvalidUsage, *refused);
    return r;
  }
  if (failIfPeerGoneLocked(r, p)) return r;
  const size_t lanes = p.lanes.size();
  size_t chunk = len;
  if (lanes > 1 && static_cast<int64_t>(len) >= opt_.stripeMinBytes)
    chunk = ((len + lanes - 1) / lanes + 4095) & ~size_t(4095);
  chunk = std::min<size_t>(std::max<size_t>(chunk, 1), bulk ? kBulkFrameBytes : FrameHeader::kMaxPayload);
  const auto* data = static_cast<const uint8_t*>(buf);
  const auto postedAt = bulk ? Clock::time_point{} : Clock::now();
  uint64_t touched = 0;  // lane indexes (at most 64 lanes)
  size_t offset = 0;
  do {
    size_t n = std::min(chunk, len - offset);
    const size_t index = p.nextLane++ % lanes;
    Lane& lane = *p.lanes[index];
    SendItem item;
    FrameHeader h;
    h.type = FrameType::kData;
    h.epoch = epoch_;
    h.commId = opt_.commId;
    h.seq = seq;
    h.tag = tag;
    h.length = static_cast<uint32_t>(n);
    h.offset = offset;
    h.total = len;
    item.chunk = {epoch_, tag, seq, offset, 0, 0, static_cast<uint32_t>(n)};
    if (payloadCrc) h.flags = FrameHeader::kPayloadChecksum, h.payloadCrc = *payloadCrc;
    if (signature && offset == 0) {
      uint8_t* bytes = item.header + FrameHeader::kSize;
      encodeSignature(*signature, bytes);
      h.flags |= FrameHeader::kCallSignature;
      h.signatureCrc = crc32c(bytes, FrameHeader::kSignatureBytes);
      item.headerBytes += FrameHeader::kSignatureBytes;
    }
    encodeFrame(h, item.header);
    item.data = data + offset;
    item.length = n;
    item.messageBytes = len;
    item.request = r;
    r->pendingChunks++;
    if (bulk) {
      lane.bulk.queue(std::move(item));
    } else {
      lane.sendQueue.push_back(std::move(item));
      lane.bulk.foregroundPosted(postedAt);
    }
    touched |= uint64_t{1} << index;
    offset += n;
  } while (offset < len);
  bool waitsForRoom = false;
  std::vector<uint64_t> heldWrites;  // tokens of lanes with a zero-copy write to do without the lock
  for (size_t i = 0; i < lanes; ++i)
    if (touched & (uint64_t{1} << i)) {
      Lane& lane = *p.lanes[i];
      flushLocked(lane);
      waitsForRoom |= lane.conduit && (lane.wantsRoom() || lane.bulk.heldBack());
      if (lane.conduit && lane.rendezvous.heldBack && lane.conduit->writesZeroCopyBesideCalls())
        heldWrites.push_back(lane.token);
    }
  // What did not fit goes when the lane has room. A poster that will not
  // drive the lanes (a background thread, a consumer that tests) leaves
  // that to the progress thread, which armed its lanes before this send
  // existed: wake it to arm them for room, or it sleeps its full timeout.
  if (waitsForRoom && !callerOwned_) wakeLoop();
  // A write into a receive the peer announced is done here, as the post
  // did before it was done unlocked: a collective that posts a send and
  // then reduces must not leave its peer waiting for the copy until its
  // next wait. Nothing of this post is touched after the lock is let go.
  for (uint64_t token : heldWrites) {
    auto it = lanesByToken_.find(token);
    if (it != lanesByToken_.end()) writeHeldIfDueLocked(*it->second);
  }
  return r;
}

RequestPtr LaneDevice::postRecv(MemberId member, uint64_t seq, uint32_t tag, void* buf, size_t len,
                               const CallSignature* signature, bool upTo) {
  connectPeer(member);
  RequestPtr r = newRequest(member, seq, /*isSend=*/false);
  MutexLock lock(mu_);
  Peer& p = peerLocked(member);
  if (aborted_) {
    completeLocked(r, ecclRemoteError, abortReason_);
    return r;
  }
  const bool p2pChecked = signature && !FrameHeader::isCollective(seq) && !r->survivesRevocation;
  InboxKey key{FrameHeader::isOutOfView(seq) ? 0 : epoch_, member, seq, tag};
  auto it = messages_.find(key);
  if (p2pChecked && it != messages_.end() && it->second.sent && !signaturesAgree(*signature, *it->second.sent))
    callMismatchLocked(member, seq, *signature, *it->second.sent);
  if (revokesLocked(seq)) {
    completeLocked(r, revokedCode_, revokedReason_);
    return r;
  }
  if (const std::string* refused = refusalOfLocked(seq)) {
    completeLocked(r, ecclInvalidUsage, *refused);
    return r;
  }
  if (it != messages_.end()) {
    Inbox& box = it->second;
    if (upTo ? box.total > len : box.total != len) {
      completeLocked(r, ecclInvalidUsage,
                     fmt::format("peer {} sent {} bytes where {}{} were expected (mismatched counts or types)",
                                 p.label, box.total, upTo ? "at most " : "", len));
      if (box.received == box.total) messages_.erase(it);
      return r;
    }
    box.request = r;
    box.userBuffer = static_cast<uint8_t*>(buf);
    r->bytes = box.total;
    if (box.received == box.total && box.exposed == 0) deliverWholeStagedLocked(it, r, p.label);
    return r;
  }
  if (failIfPeerGoneLocked(r, p)) return r;
  Inbox& box = messages_.openPosted(key, r, static_cast<uint8_t*>(buf), len, upTo);
  r->bytes = len;
  if (p2pChecked) box.expected = *signature;
  announceReceiveLocked(p, key, box);
  return r;
}

bool LaneDevice::arrived(MemberId peer, uint64_t seq, uint32_t tag, size_t* bytes, uint64_t* order) {
  MutexLock lock(mu_);
  auto it = messages_.find({FrameHeader::isOutOfView(seq) ? 0 : epoch_, peer, seq, tag});
  if (it == messages_.end() || it->second.request || it->second.cancelled || !it->second.unexpected) return false;
  *bytes = it->second.total;
  *order = it->second.arrival;
  return true;
}

void LaneDevice::cancel(const RequestPtr& r, const std::string& reason) {
  MutexLock lock(mu_);
  cancelLocked(r, reason);
  // A lane may be copying into the buffer with the lock released (its
  // read never blocks): the caller may free the buffer once this returns.
  copyWaiters_++;
  while (r->unlockedCopies > 0) cv_.waitUntil(mu_, Clock::now() + std::chrono::milliseconds(10));
  copyWaiters_--;
}

void LaneDevice::cancelLocked(const RequestPtr& r, const std::string& reason) {
  if (r->state.load() != Request::kPending) return;
  auto peer = peers_.find(r->peer);
  if (r->isSend && peer != peers_.end()) {
    for (auto& lane : peer->second.lanes) {
      std::erase_if(lane->sendQueue, [&](const SendItem& item) { return item.request == r && item.done == 0; });
      std::erase_if(lane->bulk.waiting(), [&](const SendItem& item) { return item.request == r; });
      // Started: the frame must still be whole on the wire, and a chunk
      // whose header went out still written (from a copy).
      for (auto* queue : {&lane->sendQueue, &lane->rendezvous.awaitingClearance})
        for (SendItem& item : *queue)
          if (item.request == r) item.detach();
      for (SendItem& item : lane->rendezvous.writes)
        if (item.request == r) item.request.reset();  // written from the pinned pages
    }
  }
  if (!r->isSend) {
    for (auto& [key, box] : messages_) {
      if (box.request != r) continue;
      if (box.exposed > 0) {
        // The peer may be writing into the buffer now: only closing the
        // connection stops that, so the buffer is never written again.
        MemberId peer = key.peer;
        completeLocked(r, ecclRemoteError, reason);
        failPeerLocked(peer, ecclRemoteError,
                       fmt::format("a receive from peer {} was cancelled while the peer wrote into it (zero-copy); "
                                   "the connection is closed so nothing more lands",
                                   labelLocked(peer)),
                       true);
        return;
      }
      box.request = nullptr;
      box.userBuffer = nullptr;
      box.cancelled = true;
      // A lane in the middle of this message's frame drops the rest of it.
      for (auto& [token, lane] : lanesByToken_) {
        if (lane->rx != Lane::Rx::kPayload || lane->discarding || !(lane->inboxKey == key)) continue;
        lane->discarding = true;
        box.received += lane->frame.length;
      }
      if (box.received >= box.total && box.received > 0) messages_.erase(key);
      break;
    }
  }
  completeLocked(r, ecclRemoteError, reason);
}

void LaneDevice::wait(const RequestPtr& r, Deadline deadline, const std::string& opName) {
  MutexLock lock(mu_);
  bool probed = false;
  const auto timeout = deadline - Clock::now();
  while (r->state.load() == Request::kPending) {
    waitSliceLocked(r, deadline);
    if (r->state.load() != Request::kPending || Clock::now() < deadline) continue;
    // At the deadline, ask the peer's progress thread whether the process
    // is alive. A live peer that is itself blocked on a failed member will
    // report that member soon, so we wait once more; a stopped or hung
    // process cannot answer and is declared failed.
    if (!probed && pingLocked(r->peer, r->seq)) {
      probed = true;
      auto sent = Clock::now();
      auto grace = std::min<Clock::duration>(std::chrono::milliseconds(500), timeout);
      while (r->state.load() == Request::kPending && peerLocked(r->peer).lastPong < sent &&
             Clock::now() < sent + grace)
        waitSliceLocked(r, sent + grace);
      if (r->state.load() != Request::kPending) break;
      if (peerLocked(r->peer).lastPong >= sent) {
        deadline = Clock::now() + timeout;
        continue;
      }
    }
    failPeerLocked(r->peer, ecclTimeout,
                   fmt::format("peer {} did not {} before the deadline and does not answer (timed out; stopped "
                               "or hung process?)",
                               labelLocked(r->peer), r->isSend ? "accept our data" : "send its data"),
                   true);
    completeLocked(r, ecclTimeout, fmt::format("peer {} timed out", labelLocked(r->peer)));
  }
  if (r->state.load() == Request::kFailed)
    throw Error(r->code, opName.empty() ? r->error : fmt::format("{}: {}", opName, r->error));
}

// Waits until the request completes, `until` passes or something happens
// that the caller should look at. Where the peer's lanes are all up the
// caller drives them itself; otherwise the progress thread does and wakes
// the condition variable.
void LaneDevice::waitSliceLocked(const RequestPtr& r, Deadline until) {
  if (!driveLocked(r, until)) cv_.waitUntil(mu_, until);
}

bool LaneDevice::driveLocked(const RequestPtr& r, Deadline until) {
  const int wakeFd = t_wakeFd.get();
  if (wakeFd < 0 || stopping_) return false;
  r->driverWakeFd = wakeFd;
  drivers_++;
  driving_.fetch_add(1, std::memory_order_relaxed);
  setCallerOwnedLocked(true);
  const auto started = Clock::now();
  const auto spinUntil = started + std::chrono::microseconds(opt_.spinUs);
  const auto rdmaPollUntil = started + std::chrono::microseconds(opt_.rdmaPollUs);
  unsigned pass = 0;
  while (r->state.load() == Request::kPending) {
    // Sockets cost a system call to look at and lanes in memory do not:
    // while spinning over memory, the sockets get every 8th pass, and so
    // does the scheduler (a peer on this core needs it to produce).
    const bool memory = !memoryLanes_.empty();
    const bool syscallPass = !memory || ++pass % 8 == 0;
    serviceLanesLocked(syscallPass);
    if (r->state.load() != Request::kPending) break;
    // The clock is read on the passes that make system calls anyway.
    auto now = syscallPass ? Clock::now() : spinUntil - std::chrono::nanoseconds(1);
    if (now >= until) break;
    if (now < spinUntil || (now < rdmaPollUntil && rdmaInFlightLocked())) {
      mu_.unlock();
      if (syscallPass)
        sched_yield();
      else
        for (int i = 0; i < 4; ++i) cpuRelax();
      mu_.lock();
      continue;
    }
    if (unlockedCopies_ > 0) {
      // Another thread copies with the lock released; what it completes
      // may be ours. It needs the lock back to say so.
      mu_.unlock();
      sched_yield();
      mu_.lock();
      continue;
    }
    if (!armLanesLocked()) continue;
    pollfd fds[2] = {{laneEpoll_.get(), POLLIN, 0}, {wakeFd, POLLIN, 0}};
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(until - now).count();
    mu_.unlock();
    int ready = ::poll(fds, 2, static_cast<int>(std::min<int64_t>(ms, 1000)));
    if (ready > 0 && (fds[1].revents & POLLIN)) {
      uint64_t drained;
      [[maybe_unused]] ssize_t rc = ::read(wakeFd, &drained, sizeof(drained));
    }
    mu_.lock();
  }
  r->driverWakeFd = -1;
  drivers_--;
  driving_.fetch_sub(1, std::memory_order_relaxed);
  leaseUntil_ = Clock::now() + std::chrono::milliseconds(kLeaseMs);
  return true;
}

void LaneDevice::waitAny(const std::vector<RequestPtr>& requests, Deadline until) {
  MutexLock lock(mu_);
  for (const RequestPtr& r : requests)
    if (r->state.load() != Request::kPending) return;
  if (Clock::now() < until) cv_.waitUntil(mu_, until);
}

void LaneDevice::serviceLanesAsGuestLocked() {
  serviceLanesLocked();
  if (!callerOwned_ && !armLanesLocked()) wakeLoop();
}

void LaneDevice::progress() {
  MutexLock lock(mu_);
  if (callerOwned_) serviceLanesLocked();  // otherwise the progress thread is on it
}

bool LaneDevice::test(const RequestPtr& r, const std::string& opName) {
  int s = r->state.load();
  if (s == Request::kPending) return false;
  if (s == Request::kFailed) {
    MutexLock lock(mu_);
    throw Error(r->code, fmt::format("{}: {}", opName, r->error));
  }
  return true;
}

void LaneDevice::progressLoop() {
  t_progressThread = true;
  if (opt_.pinProgressThread)
    for (auto& backend : backends_)
      if (backend->placeThread()) break;
  epoll_event events[2];
  int timeoutMs = 200;
  bool helping = false;  // the last look left helpWanted_ set: look again, whatever woke it
  while (!stopping_) {
    int n = epoll_wait(epollFd_.get(), events, 2, timeoutMs);
    if (n < 0 && errno != EINTR) {
      log::warn("epoll_wait: {}", strerror(errno));
      continue;
    }
    bool woken = false;
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 != kWakeToken) continue;
      uint64_t drained;
      [[maybe_unused]] ssize_t rc = ::read(eventFd_.get(), &drained, sizeof(drained));
      woken = true;
    }
    // A caller drives the lanes: there is nothing to do here but what a
    // wake asks for. Not taking the lock on every lease tick spares a
    // caller that let it go around a copy from finding it taken (4 ranks
    // on 2 cores: 5% of busbw at 32-64 MiB over shared memory).
    if (!woken && !helping && driving_.load(std::memory_order_relaxed) > 0) {
      timeoutMs = kLeaseMs;
      continue;
    }
    MutexLock lock(mu_);
    joinFinishedDialsLocked();
    // Take the lanes back once their lease has run out with nobody driving.
    if (callerOwned_ && drivers_ == 0 && Clock::now() >= leaseUntil_) setCallerOwnedLocked(false);
    timeoutMs = callerOwned_ ? kLeaseMs : 200;
    if (!callerOwned_) {
      serviceLanesLocked();
      if (!armLanesLocked()) timeoutMs = 0;
    } else if (helpWanted_) {
      // A caller copies one lane: this thread takes the others, and keeps
      // looking while anyone copies (a striped message's lanes fill together).
      serviceLanesLocked();
      helpWanted_ = unlockedCopies_ > 0;
      if (helpWanted_) timeoutMs = 0;
    }
    helping = helpWanted_;
  }
}

// Small frames arrive through the lane's receive buffer, several per
// recv(); a large payload is read straight into its destination. A short
// read means the socket is empty, so no recv() is spent on EAGAIN.
bool LaneDevice::readLocked(Lane& lane, bool mayUnlock, bool* drained) {
  lane.reading = true;
  const uint64_t ticket = lane.readTicket = ++readTickets_;
  const uint64_t token = lane.token;
  if (!readFramesLocked(lane, mayUnlock, drained)) {
    // Closed meanwhile; while the lock was released it may even have been
    // destroyed (its peer removed; another lane may live at its address
    // now, read by someone else) or opened again (a new connection, a new
    // token): it is touched only if it still exists and is still ours.
    if (!mayUnlock || (laneExistsLocked(&lane) && lane.readTicket == ticket)) lane.reading = false;
    return false;
  }
  // Writes cleared by what was read start now, after every frame that came
  // with them was answered; so do sends other threads queued while the
  // lock was released (they start no zero-copy write on a lane being read).
  if (lane.conduit && (lane.rendezvous.heldBack || (mayUnlock && lane.hasSends()))) flushLocked(lane, /*startWrite=*/true);
  lane.reading = false;
  return lane.token == token;  // no lock let go since readFramesLocked: `lane` exists
}

// A lane gets up to kReadBudgetPerEvent per pass; once a foreground request
// completed in the pass it gets one read, so a caller woken by that
// completion does not wait for megabytes of another transfer (epoll is
// level-triggered and a lane in memory is looked at every pass: what is
// left is read next pass).
bool LaneDevice::readFramesLocked(Lane& lane, bool mayUnlock, bool* drainedOut) {
  const uint64_t token = lane.token;
  size_t budget = kReadBudgetPerEvent;
  bool drained = false, readOnce = false;
  if (drainedOut) *drainedOut = false;
  for (;;) {
    while (lane.rxBegin < lane.rxEnd) {
      size_t want;
      uint8_t* dst = rxDestinationLocked(lane, &want);
      size_t n = std::min(want, lane.rxEnd - lane.rxBegin);
      if (dst && n) copyBytes(dst, lane.rxBuffer.get() + lane.rxBegin, n);
      lane.rxBegin += n;
      if (!advanceLocked(lane, n)) return false;
    }
    lane.rxBegin = lane.rxEnd = 0;
    if (drainedOut) *drainedOut = drained;
    if (drained || budget == 0 || (readOnce && foregroundCompleted_)) return true;
    readOnce = true;
    size_t want;
    uint8_t* dst = rxDestinationLocked(lane, &want);
    const bool direct = lane.rx == Lane::Rx::kPayload && dst && want >= kDirectReadBytes;
    uint8_t* into = direct ? dst : lane.rxBuffer.get();
    const size_t ask = direct ? want : kRxBufferBytes;
    RequestPtr pinned = direct && mayUnlock ? unlockedReadTargetLocked(lane) : nullptr;
    ssize_t rc = pinned ? readUnlocked(lane, pinned, into, ask) : lane.conduit->read(into, ask);
    // Closed while the lock was released: what was read belongs to no
    // stream any more (and `lane` may be gone).
    if (pinned && !laneAliveLocked(&lane, token)) return false;
    if (rc <= 0) {
      const int error = errno;
      if (rc < 0 && (error == EAGAIN || error == EINTR)) return true;
      MemberId remote = lane.key.remote;
      Peer& p = peers_[remote];
      // After our goodbye a peer closes its end instead of answering: orderly.
      if (lane.saidGoodbye || closing_) {
        closeLaneLocked(lane);
        markLeftLocked(p);
        return false;
      }
      // Another lane of a dying peer is being drained: that drain fails it.
      if (p.drainingLanes) return false;
      std::string failure = rc < 0 ? lane.conduit->failure() : std::string();
      std::string why = rc == 0            ? "closed the connection"
                        : failure.empty() ? fmt::format("connection error: {}", strerror(error))
                                          : fmt::format("lane failed: {}", failure);
      const bool closed = rc == 0 || (failure.empty() && (error == ECONNRESET || error == EPIPE));
      std::string reason = fmt::format("peer {} {} (lane {})", p.label, why, lane.key.lane);
      readWhatFailedPeerSentLocked(remote, /*mayWait=*/false);
      failPeerLocked(remote, ecclRemoteError, reason, true, 0,
                     closed ? FailureEvidence::kPeerClosed : FailureEvidence::kObserved);
      return false;
    }
    size_t got = static_cast<size_t>(rc);
    stats_.bytesReceived += got;
    budget -= std::min(budget, got);
    drained = got < ask;
    if (!direct) {
      lane.rxEnd = got;
    } else if (!advanceLocked(lane, got)) {
      return false;
    }
    if (lane.token != token) return false;
  }
}

// Only a posted receive's own buffer is filled without the lock: its
// request is pinned (completeLocked holds a completion back, cancel waits)
// for the read's length. A staged message's buffer belongs to its inbox
// entry, which may be erased or recycled at any time.
RequestPtr LaneDevice::unlockedReadTargetLocked(const Lane& lane) {
  if (!lane.conduit->readsBesideCalls() || lane.frame.type != FrameType::kData || lane.discarding) return nullptr;
  auto it = messages_.find(lane.inboxKey);
  if (it == messages_.end() || it->second.unexpected || !it->second.request) return nullptr;
  return it->second.request;
}

// Copies the payload with the device lock released. Meanwhile the lane is
// this thread's (Lane::reading), the conduit is kept alive by this
// reference even if the lane closes, and the receive cannot complete.
ssize_t LaneDevice::readUnlocked(Lane& lane, const RequestPtr& pinned, uint8_t* into, size_t n) {
  std::shared_ptr<Conduit> conduit = lane.conduit;
  if (opt_.copyHelpBytes > 0 && n >= static_cast<uint64_t>(opt_.copyHelpBytes) && callerOwned_ && !helpWanted_ &&
      !t_progressThread && peers_[lane.key.remote].lanes.size() > 1) {
    helpWanted_ = true;
    wakeLoop();
  }
  const ssize_t rc = copyWithLockReleased(pinned, [&] { return conduit->read(into, n); });
  if (rc > 0) stats_.bytesReadUnlocked += static_cast<uint64_t>(rc);
  if (rc > 0 && t_progressThread && callerOwned_) stats_.bytesCopiedByHelper += static_cast<uint64_t>(rc);
  return rc;
}

void LaneDevice::pinLocked(const RequestPtr& r) {
  if (r) r->unlockedCopies++;
  unlockedCopies_++;
}

void LaneDevice::unpinLocked(const RequestPtr& r) {
  unlockedCopies_--;
  if (r && --r->unlockedCopies == 0 && r->heldCompletion) {
    auto [code, why] = std::move(*r->heldCompletion);
    r->heldCompletion.reset();
    completeLocked(r, code, std::move(why));
  }
  if (copyWaiters_ > 0) cv_.notifyAll();  // cancel waits for the buffer to be let go
}

// Where the next bytes of the current frame go (null: skipped) and how many
// it still needs.
uint8_t* LaneDevice::rxDestinationLocked(Lane& lane, size_t* want) {
  if (lane.rx == Lane::Rx::kHeader) {
    *want = FrameHeader::kSize - lane.headerGot;
    return lane.header + lane.headerGot;
  }
  if (lane.rx == Lane::Rx::kSignature) {
    *want = FrameHeader::kSignatureBytes - lane.signatureGot;
    return lane.signature + lane.signatureGot;
  }
  *want = lane.frame.length - lane.payloadGot;
  if (lane.frame.type != FrameType::kData) return lane.control.data() + lane.payloadGot;
  return lane.discarding ? nullptr : lane.target + lane.payloadGot;
}

// Accounts for `got` bytes of the current frame; false once the lane is
// closed or failed (its remaining bytes must not be looked at).
bool LaneDevice::advanceLocked(Lane& lane, size_t got) {
  const uint64_t token = lane.token;
  if (lane.rx == Lane::Rx::kHeader) {
    lane.headerGot += got;
    if (lane.headerGot < FrameHeader::kSize) return true;
    lane.headerGot = 0;
    if (!onHeaderLocked(lane)) return false;
    if (lane.rx == Lane::Rx::kSignature) return true;
  } else if (lane.rx == Lane::Rx::kSignature) {
    lane.signatureGot += got;
    if (lane.signatureGot < FrameHeader::kSignatureBytes) return true;
    if (!onSignatureLocked(lane)) return false;
  } else {
    lane.payloadGot += got;
  }
  if (lane.frame.type == FrameType::kData && (lane.frame.flags & (FrameHeader::kRendezvous | FrameHeader::kPrewritten))) {
    lane.rx = Lane::Rx::kHeader;  // its bytes come by a zero-copy write, not on the lane
    if (lane.token == token && (lane.frame.flags & FrameHeader::kBulkCredit)) bulkFrameReadLocked(lane);
    return lane.token == token;
  }
  if (lane.payloadGot < lane.frame.length) return true;
  lane.rx = Lane::Rx::kHeader;
  if (lane.frame.flags & FrameHeader::kBulkCredit) bulkFrameReadLocked(lane);
  if (lane.frame.type == FrameType::kData)
    onPayloadDoneLocked(lane);
  else
    onControlLocked(lane);
  return lane.token == token;
}

bool LaneDevice::onHeaderLocked(Lane& lane) {
  std::string why;
  auto h = decodeFrame(lane.header, &why);
  MemberId remote = lane.key.remote;
  if (h && h->commId != opt_.commId)
    why = fmt::format("frame for communicator {:016x}, this is {:016x}", h->commId, opt_.commId), h.reset();
  if (!h) {
    stats_.framesRejected++;
    failPeerLocked(remote, ecclRemoteError,
                   fmt::format("peer {} sent a malformed frame on lane {} ({}); connection dropped",
                               labelLocked(remote), lane.key.lane, why),
                   true);
    return false;
  }
  lane.frame = *h;
  lane.target = nullptr;
  lane.discarding = true;
  lane.rx = Lane::Rx::kPayload;
  lane.payloadGot = 0;
  if (h->type != FrameType::kData) {
    lane.control.assign(h->length, 0);
    return true;
  }
  if (h->flags & FrameHeader::kCallSignature) {
    lane.rx = Lane::Rx::kSignature;
    lane.signatureGot = 0;
    return true;
  }
  return onDataFrameLocked(lane, nullptr);
}

bool LaneDevice::onSignatureLocked(Lane& lane) {
  lane.rx = Lane::Rx::kPayload;
  std::string why = "its checksum does not match";
  std::optional<CallSignature> sig;
  if (crc32c(lane.signature, FrameHeader::kSignatureBytes) == lane.frame.signatureCrc)
    sig = decodeSignature(lane.signature, &why);
  if (!sig) {
    stats_.framesRejected++;
    failPeerLocked(lane.key.remote, ecclRemoteError,
                   fmt::format("peer {} sent a malformed call signature on lane {} ({}); connection dropped",
                               labelLocked(lane.key.remote), lane.key.lane, why),
                   true);
    return false;
  }
  return onDataFrameLocked(lane, &*sig);
}

// Finds where a data frame's payload goes, once its header (and call
// signature) are in; a zero-copy chunk's sender is told where to write it.
bool LaneDevice::onDataFrameLocked(Lane& lane, const CallSignature* signature) {
  if (lane.frame.flags & FrameHeader::kPrewritten) return onPrewrittenLocked(lane, signature);
  const uint64_t token = lane.token;
  if (!placeDataFrameLocked(lane, signature)) return false;
  if (lane.token == token && (lane.frame.flags & FrameHeader::kRendezvous)) clearToSendLocked(lane);
  return lane.token == token;
}

bool LaneDevice::placeDataFrameLocked(Lane& lane, const CallSignature* signature) {
  const FrameHeader* h = &lane.frame;
  MemberId remote = lane.key.remote;
  const bool outOfView = FrameHeader::isOutOfView(h->seq);
  if (h->epoch < epoch_ && !outOfView) {
    stats_.staleFramesDropped++;
    log::trace("dropped a stale frame from {} (epoch {} < {})", labelLocked(remote), h->epoch, epoch_);
    return true;  // the payload is read and discarded
  }
  if (signature && FrameHeader::isCollective(h->seq)) {
    if (auto m = signatures_.remote(h->epoch, h->seq, remote, *signature)) {
      callMismatchLocked(remote, h->seq, m->mine, m->theirs);
      return true;  // discarded: the op is dead
    }
  }
  InboxKey key{outOfView ? 0 : h->epoch, remote, h->seq, h->tag};
  auto it = messages_.find(key);
  if (it == messages_.end() && !outOfView && h->epoch == epoch_ && FrameHeader::isCollective(h->seq) &&
      refusalOfLocked(h->seq)) {
    // Nobody here will ever ask for a refused op's message: read and dropped.
    it = messages_.openDiscarded(key, h->total);
  }
  if (it == messages_.end()) {
    try {
      it = messages_.openUnexpected(key, h->total);
    } catch (const std::bad_alloc&) {
      failPeerLocked(remote, ecclSystemError,
                     fmt::format("peer {} sent an unexpected message of {} bytes that cannot be staged",
                                 labelLocked(remote), h->total),
                     true);
      return false;
    }
  }
  Inbox& box = it->second;
  if (box.cancelled) {  // nobody wants it any more: read and drop
    if (box.upTo && box.received == 0) box.total = h->total, box.upTo = false;
    box.received += h->length;
    if (FrameHeader::isCollective(h->seq) && refusalOfLocked(h->seq)) stats_.refusedBytesDropped += h->length;
    lane.discarding = true;
    if (box.received >= box.total) messages_.erase(it);
    return true;
  }
  if (signature && !FrameHeader::isCollective(h->seq) && !FrameHeader::survivesRevocation(h->seq)) {
    box.sent = *signature;
    if (box.request && box.expected && !signaturesAgree(*box.expected, *signature)) {
      callMismatchLocked(remote, h->seq, *box.expected, *signature);
      return true;  // the revocation failed and dropped the receive
    }
  }
  if (!fitsLocked(box, h->total)) {
    // The sender's message size disagrees with the posted receive: fail the
    // receive, discard this message, keep the connection.
    dropBoxLocked(it, ecclInvalidUsage,
                  fmt::format("peer {} sent {} bytes where {}{} were expected (mismatched counts or types)",
                              labelLocked(remote), h->total, box.upTo ? "at most " : "", box.total));
    return true;
  }
  if (box.upTo && box.total != h->total) {  // the first frame of a message shorter than the receive
    box.total = h->total;
    if (box.request) box.request->bytes = h->total;
  }
  if (h->flags & FrameHeader::kPayloadChecksum) box.checksummed = true, box.crc = h->payloadCrc;
  lane.inboxKey = key;
  lane.target = box.base() + h->offset;
  lane.discarding = false;
  return true;
}

// A message whose sender attached a CRC32C is verified once whole; a
// mismatch fails that receive only (the connection and the view stay).
bool LaneDevice::checksumHoldsLocked(Inbox& box, const std::string& peerLabel) {
  if (!box.checksummed) return true;
  uint32_t got = crc32c(box.base(), box.total);
  if (got == box.crc) return true;
  completeLocked(box.request, ecclRemoteError, checksumFailure(box.total, peerLabel, box.crc, got));
  return false;
}

std::string LaneDevice::checksumFailure(size_t bytes, const std::string& peerLabel, uint32_t expected, uint32_t got) {
  return fmt::format("the {}-byte message from peer {} failed its checksum (CRC32C {:08x} expected, the data has "
                     "{:08x}): a corrupted record",
                     bytes, peerLabel, expected, got);
}

// A receive posted for a message that came whole before it. Its entry
// leaves the table and the request is not yet returned to anyone, so
// nothing else touches the staged bytes or the caller's buffer: from
// kDirectReadBytes they are checked and copied with the lock released, so
// another lane's frames, a poster or a ping's answer do not wait for it.
void LaneDevice::deliverWholeStagedLocked(MessageTable::iterator it, const RequestPtr& r, std::string peerLabel) {
  const size_t total = it->second.total;
  const bool checked = it->second.checksummed;
  const uint32_t expected = it->second.crc;
  uint8_t* into = it->second.userBuffer;
  StagingBuffer staged = messages_.takeStaged(it);
  uint32_t got = expected;
  auto copy = [&] {
    if (checked) got = crc32c(staged.bytes.get(), total);
    if (got == expected && total) copyBytes(into, staged.bytes.get(), total);
    return 0;
  };
  if (total >= kDirectReadBytes) {
    copyWithLockReleased(r, copy);
    stats_.stagedBytesCopiedUnlocked += total;
  } else {
    copy();
  }
  messages_.giveBack(staged);
  if (got != expected) {
    completeLocked(r, ecclRemoteError, checksumFailure(total, peerLabel, expected, got));
    return;
  }
  completeLocked(r, ecclSuccess, {});
}

void LaneDevice::onPayloadDoneLocked(Lane& lane) {
  if (lane.discarding) return;
  auto it = messages_.find(lane.inboxKey);
  if (it == messages_.end()) return;
  it->second.received += lane.frame.length;
  messageArrivedLocked(it, labelLocked(lane.key.remote));
}

// Completes the receive once every byte of its message is in.
void LaneDevice::messageArrivedLocked(MessageTable::iterator it, const std::string& peerLabel) {
  Inbox& box = it->second;
  if (box.received >= box.total) closeReceiveWindowLocked(it->first, box, /*withdrawn=*/false);
  if (box.received < box.total || !box.request || box.exposed > 0) return;
  if (!checksumHoldsLocked(box, peerLabel)) {
    messages_.erase(it);
    return;
  }
  messages_.deliverStaged(box);
  completeLocked(box.request, ecclSuccess, {});
  messages_.erase(it);
}

}  // namespace eccl::transport::lanes
