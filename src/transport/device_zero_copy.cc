// Zero-copy chunks by rendezvous, over a back end that writes into the
// peer's memory (Conduit::zeroCopyMinBytes, docs/transport.md): the sender's
// data frame goes out as a header alone (kRendezvous); the receiver finds
// where the chunk belongs as for any frame, exposes that memory and answers
// with a clear-to-send naming it; the sender writes the chunk there and then
// sends kLanded on the same lane, which the connection delivers after the
// data. Every exchange is answered in the order it was asked, so each side
// keeps a queue per lane and checks the chunk it names.
#include "transport/lane_device.h"

namespace eccl::transport::lanes {
namespace {

const char* answerName(uint32_t answer) {
  switch (answer) {
    case ChunkRef::kWriteHere: return "write here";
    case ChunkRef::kSendOnLane: return "send it on the lane";
    case ChunkRef::kDropped: return "dropped";
    default: return "malformed";
  }
}

}  // namespace

// Receiver: a rendezvous header has been placed (or dropped).
void LaneDevice::clearToSendLocked(Lane& lane) {
  const FrameHeader& h = lane.frame;
  ChunkRef chunk{h.epoch, h.tag, h.seq, h.offset, 0, 0, h.length, ChunkRef::kDropped};
  if (!lane.conduit->zeroCopyMinBytes()) {
    stats_.framesRejected++;
    failPeerLocked(lane.key.remote, ecclRemoteError,
                   fmt::format("peer {} sent a zero-copy chunk on lane {}, which cannot carry one ({}); connection "
                               "dropped",
                               labelLocked(lane.key.remote), lane.key.lane, lane.conduit->kind()),
                   true);
    return;
  }
  auto it = lane.discarding ? messages_.end() : messages_.find(lane.inboxKey);
  // A receive announced on this lane is registered already: the chunk is
  // cleared into that window (the sender, which heard of it first on this
  // lane, counts the write against it before it lets a withdrawn one go).
  auto announced =
      it == messages_.end() || it->second.unexpected ? lane.rendezvous.windows.end()
                                                     : lane.rendezvous.window(lane.inboxKey);
  if (announced != lane.rendezvous.windows.end()) {
    chunk.address = announced->chunk.address + h.offset;
    chunk.key = announced->chunk.key;
    chunk.answer = ChunkRef::kWriteHere;
    lane.rendezvous.exposures.push_back({lane.inboxKey, chunk, /*handle: the window's*/ 0});
    it->second.exposed++;
    stats_.zeroCopyChunksReceived++;
  } else if (it != messages_.end()) {
    if (auto window = lane.conduit->expose(lane.target, h.length)) {
      chunk.address = window->address;
      chunk.key = window->key;
      chunk.answer = ChunkRef::kWriteHere;
      lane.rendezvous.exposures.push_back({lane.inboxKey, chunk, window->handle});
      it->second.exposed++;
      stats_.zeroCopyChunksReceived++;
    } else {
      chunk.answer = ChunkRef::kSendOnLane;
    }
  }
  lane.discarding = true;
  log::trace("rendezvous: {} offers op {:#x} tag {} offset {} ({} B) on lane {}: {}", labelLocked(lane.key.remote),
             h.seq, h.tag, h.offset, h.length, lane.key.lane, answerName(chunk.answer));
  queueControlLocked(lane, FrameType::kClearToSend, encodeChunkRef(chunk));
}

// Sender: the receiver said where (or that it dropped the chunk, or wants
// it on the lane).
void LaneDevice::onClearToSendLocked(Lane& lane) {
  ChunkRef cleared = decodeChunkRef(lane.control.data());
  if (lane.rendezvous.awaitingClearance.empty() || !lane.rendezvous.awaitingClearance.front().chunk.sameChunk(cleared) ||
      cleared.answer > ChunkRef::kSendOnLane) {
    stats_.framesRejected++;
    failPeerLocked(lane.key.remote, ecclRemoteError,
                   fmt::format("peer {} sent a clear-to-send on lane {} for a chunk not offered to it (op {:#x} tag {} "
                               "offset {}, answer {}); connection dropped",
                               labelLocked(lane.key.remote), lane.key.lane, cleared.seq, cleared.tag, cleared.offset,
                               cleared.answer),
                   true);
    return;
  }
  log::trace("rendezvous: {} answered op {:#x} tag {} offset {} on lane {}: {}", labelLocked(lane.key.remote),
             cleared.seq, cleared.tag, cleared.offset, lane.key.lane, answerName(cleared.answer));
  SendItem item = std::move(lane.rendezvous.awaitingClearance.front());
  lane.rendezvous.awaitingClearance.pop_front();
  if (cleared.answer != ChunkRef::kWriteHere) {
    lane.conduit->release(item.pinned);
    item.pinned = 0;
    if (cleared.answer == ChunkRef::kDropped) {
      finishChunkLocked(item.request);
      return;
    }
    // On the lane after all, as an ordinary frame, ahead of what has not
    // started (never inside a frame half written).
    item.rendezvous = false;
    item.done = 0;
    markRendezvous(item.header, false);
    auto at = lane.sendQueue.begin();
    if (at != lane.sendQueue.end() && at->done > 0) ++at;
    lane.sendQueue.insert(at, std::move(item));
    flushLocked(lane);
    return;
  }
  item.chunk = cleared;
  countClearedWriteLocked(lane, item);
  lane.rendezvous.writes.push_back(std::move(item));
  // Started once the frames read with this one are dealt with (readLocked
  // flushes the lane after the read): see startZeroCopyWriteLocked.
  lane.rendezvous.heldBack = true;
}

// Starts the oldest cleared write not yet started, one per call: a software
// provider (Soft-RoCE) moves a write's bytes inside the post, so posting
// every cleared write at once would keep the peer's own rendezvous (its
// headers waiting for our clear-to-send, behind them on the lane) unanswered
// for all their time, and the two directions would take turns instead of
// running together. On an HCA a post is a doorbell, and the next pass posts
// the next write microseconds later. True when one started.
bool LaneDevice::startZeroCopyWriteLocked(Lane& lane) {
  if (lane.rendezvous.writing) return false;  // another thread's write runs; it looks again after
  lane.rendezvous.heldBack = false;
  auto next = std::find_if(lane.rendezvous.writes.begin(), lane.rendezvous.writes.end(),
                           [](const SendItem& item) { return item.ticket == 0; });
  if (next == lane.rendezvous.writes.end()) return false;
  if (lane.conduit->writesZeroCopyBesideCalls()) {
    // Copied with the lock released, by the post or the next pass over the
    // lanes (serviceLanesLocked), not inside a flush any post may start.
    lane.rendezvous.heldBack = true;
    return false;
  }
  SendItem& item = *next;
  const bool tracing = log::threshold() >= log::Level::kTrace;
  const auto posting = tracing ? Clock::now() : Clock::time_point{};
  if (!lane.conduit->writeZeroCopy(item.pinned, item.pinnedFrom, item.length, item.chunk.address, item.chunk.key))
    return false;  // no send slot: a completion brings the lane back
  if (tracing)
    log::trace("rendezvous: wrote op {:#x} tag {} offset {} ({} B) to {} on lane {} (the post took {} us)",
               item.chunk.seq, item.chunk.tag, item.chunk.offset, item.length, labelLocked(lane.key.remote),
               lane.key.lane, std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - posting).count());
  zeroCopyWriteStartedLocked(lane, item, std::next(next) != lane.rendezvous.writes.end());
  return true;
}

void LaneDevice::zeroCopyWriteStartedLocked(Lane& lane, SendItem& item, bool more) {
  item.ticket = ++lane.rendezvous.started;
  item.notice = ++lane.rendezvous.noticesQueued;
  stats_.bytesSent += item.length;
  stats_.zeroCopyChunksSent++;
  if (item.prewritten) {  // its header follows the write on the lane: there is nobody to ask
    SendItem header;
    std::memcpy(header.header, item.header, item.headerBytes);
    header.headerBytes = item.headerBytes;
    lane.sendQueue.push_back(std::move(header));
    stats_.zeroCopyChunksPrewritten++;
  } else {
    queueControlLocked(lane, FrameType::kLanded, encodeChunkRef(item.chunk), /*flush=*/false);
  }
  lane.sendQueue.back().notice = item.notice;
  lane.rendezvous.heldBack = more;
}

// The write is marked under way (ticket kWritingTicket) while the lock is
// released: nothing reaps it, and no other write on the lane starts
// (LaneRendezvous::writing), so it is the same item when the lock is back.
// The send is pinned, so its buffer outlives a cancel or a failure meanwhile.
bool LaneDevice::writeHeldZeroCopyLocked(Lane& lane) {
  constexpr uint64_t kWritingTicket = ~uint64_t{0};
  lane.rendezvous.heldBack = false;
  auto next = std::find_if(lane.rendezvous.writes.begin(), lane.rendezvous.writes.end(),
                           [](const SendItem& item) { return item.ticket == 0; });
  if (next == lane.rendezvous.writes.end()) return true;
  const uint64_t token = lane.token;
  std::shared_ptr<Conduit> conduit = lane.conduit;
  RequestPtr pinned = next->request;
  const SendItem& item = *next;
  const uint64_t handle = item.pinned, address = item.chunk.address;
  const uint8_t* from = item.pinnedFrom;
  const size_t length = item.length;
  const uint32_t key = item.chunk.key;
  next->ticket = kWritingTicket;
  lane.rendezvous.writing = true;
  const bool started =
      copyWithLockReleased(pinned, [&] { return conduit->writeZeroCopy(handle, from, length, address, key); });
  if (!laneAliveLocked(&lane, token)) return false;
  lane.rendezvous.writing = false;
  auto it = std::find_if(lane.rendezvous.writes.begin(), lane.rendezvous.writes.end(),
                         [](const SendItem& i) { return i.ticket == kWritingTicket; });
  if (it == lane.rendezvous.writes.end()) return true;  // not expected: the lane kept it
  if (!started) {
    it->ticket = 0;  // no room: a completion brings the lane back
    return true;
  }
  stats_.zeroCopyBytesUnlocked += length;
  const bool more =
      std::any_of(std::next(it), lane.rendezvous.writes.end(), [](const SendItem& i) { return i.ticket == 0; });
  zeroCopyWriteStartedLocked(lane, *it, more);
  flushLocked(lane);  // its kLanded, or its header
  return lane.token == token;
}

bool LaneDevice::zeroCopyWriteFinishedLocked(const Lane& lane) const {
  if (lane.rendezvous.writes.empty()) return false;
  const SendItem& oldest = lane.rendezvous.writes.front();
  return oldest.ticket != 0 && oldest.ticket <= lane.conduit->zeroCopyWritesDone() &&
         oldest.notice <= lane.rendezvous.noticesWritten;
}

void LaneDevice::reapZeroCopyWritesLocked(Lane& lane) {
  while (zeroCopyWriteFinishedLocked(lane)) {
    SendItem& item = lane.rendezvous.writes.front();
    log::trace("rendezvous: the write of op {:#x} tag {} offset {} to {} completed", item.chunk.seq, item.chunk.tag,
               item.chunk.offset, labelLocked(lane.key.remote));
    lane.conduit->release(item.pinned);
    RequestPtr r = std::move(item.request);
    const ChunkRef chunk = item.chunk;
    const bool intoAnnounced = item.intoAnnounced;
    lane.rendezvous.writes.pop_front();
    if (intoAnnounced) prewriteFinishedLocked(lane, chunk);
    finishChunkLocked(r);
  }
}

// Receiver: the sender's write of the oldest exposed chunk is in.
void LaneDevice::onLandedLocked(Lane& lane) {
  ChunkRef landed = decodeChunkRef(lane.control.data());
  if (lane.rendezvous.exposures.empty() || !lane.rendezvous.exposures.front().chunk.sameChunk(landed)) {
    stats_.framesRejected++;
    failPeerLocked(lane.key.remote, ecclRemoteError,
                   fmt::format("peer {} said a chunk landed on lane {} that it was not cleared to write (op {:#x} "
                               "tag {} offset {}); connection dropped",
                               labelLocked(lane.key.remote), lane.key.lane, landed.seq, landed.tag, landed.offset),
                   true);
    return;
  }
  log::trace("rendezvous: op {:#x} tag {} offset {} ({} B) from {} landed", landed.seq, landed.tag, landed.offset,
             landed.length, labelLocked(lane.key.remote));
  Exposure exposure = lane.rendezvous.exposures.front();
  lane.rendezvous.exposures.pop_front();
  lane.conduit->release(exposure.handle);
  stats_.bytesReceived += exposure.chunk.length;
  chunkLandedLocked(exposure.key, exposure.chunk.length, /*arrived=*/true, labelLocked(lane.key.remote));
}

// An exposed chunk is done with: it arrived, or its lane closed (nothing
// more can land; the message then fails with its peer).
void LaneDevice::chunkLandedLocked(const InboxKey& key, size_t bytes, bool arrived, const std::string& peerLabel) {
  if (auto it = messages_.find(key); it != messages_.end()) {
    Inbox& box = it->second;
    box.exposed--;
    if (!arrived) return;
    box.received += bytes;
    if (box.cancelled) {
      if (box.received >= box.total && box.exposed == 0) messages_.erase(it);
      return;
    }
    messageArrivedLocked(it, peerLabel);
    return;
  }
  std::optional<Draining> drained;
  if (messages_.finishDrainingOne(key, &drained) && drained && drained->request)
    completeLocked(drained->request, drained->code, drained->reason);
}

MessageTable::iterator LaneDevice::dropBoxLocked(MessageTable::iterator it, ecclResult_t code,
                                                 const std::string& reason) {
  Inbox& box = it->second;
  closeReceiveWindowLocked(it->first, box, /*withdrawn=*/true);
  if (box.exposed == 0) {
    if (box.request) completeLocked(box.request, code, reason);
    return messages_.erase(it);
  }
  return messages_.eraseDraining(it, code, reason);
}

void LaneDevice::failLaneSendsLocked(Lane& lane, ecclResult_t code, const std::string& reason) {
  for (auto* queue :
       {&lane.sendQueue, &lane.bulk.waiting(), &lane.rendezvous.awaitingClearance, &lane.rendezvous.writes})
    for (SendItem& item : *queue)
      if (item.request) completeLocked(item.request, code, reason);
}

}  // namespace eccl::transport::lanes
