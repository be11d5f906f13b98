// Receiver-driven rendezvous (docs/transport.md): a collective's receive
// posted before any of its message came is announced to the sender with
// its whole buffer's address and key (kReceiveReady), so the sender writes
// its large chunks there at once and sends each chunk's header after the
// write (kPrewritten), without the header / clear-to-send round trip. A
// sender that has not heard of the window yet uses the clear-to-send path;
// both can serve one message. The window closes when the message has
// arrived; a receive dropped before (revoked, superseded) is withdrawn and
// its memory stays exposed until the sender says no write of its into it
// is under way (kReceiveReleased), so a failed receive's buffer is never
// written after its request completed.
//
// Only collectives announce: their (epoch, op, tag) names one message,
// where a point-to-point consumer may use a key again once a message
// arrived, and a sender could then write the next message into the last
// one's buffer.
#include "transport/lane_device.h"

namespace eccl::transport::lanes {
namespace {

std::tuple<uint32_t, uint64_t, uint32_t> readyKey(const ChunkRef& c) { return {c.epoch, c.seq, c.tag}; }

}  // namespace

void LaneDevice::announceReceiveLocked(Peer& p, const InboxKey& key, Inbox& box) {
  if (!opt_.zeroCopy || !opt_.announceReceives || box.upTo || !FrameHeader::isCollective(key.seq) || box.total == 0 ||
      box.total > UINT32_MAX || p.state != Peer::State::kUp)
    return;
  for (size_t i = 0; i < p.lanes.size(); ++i) {
    Lane& lane = *p.lanes[i];
    if (!lane.conduit) continue;
    const size_t least = lane.conduit->zeroCopyMinBytes();
    if (least == 0 || box.total < least) return;
    auto window = lane.conduit->expose(box.userBuffer, box.total);
    if (!window) return;  // the chunks are offered one by one instead
    ChunkRef whole{key.epoch, key.tag,          key.seq, 0, window->address, window->key, static_cast<uint32_t>(box.total),
                   ChunkRef::kWriteHere};
    lane.rendezvous.windows.push_back({key, whole, window->handle});
    box.readyLane = static_cast<int>(i);
    box.exposed++;
    stats_.receivesAnnounced++;
    log::trace("rendezvous: announced op {:#x} tag {} ({} B) to {} on lane {}", key.seq, key.tag, box.total, p.label,
               lane.key.lane);
    queueControlLocked(lane, FrameType::kReceiveReady, encodeChunkRef(whole));
    return;
  }
}

// The message arrived (the window closes now: nothing more is written into
// it), or the receive is being dropped (withdrawn: the window stays until
// the sender releases it).
void LaneDevice::closeReceiveWindowLocked(const InboxKey& key, Inbox& box, bool withdrawn) {
  if (box.readyLane < 0) return;
  const size_t index = static_cast<size_t>(box.readyLane);
  box.readyLane = -1;
  auto peer = peers_.find(key.peer);
  if (peer == peers_.end() || index >= peer->second.lanes.size()) return;
  Lane& lane = *peer->second.lanes[index];
  auto window = lane.rendezvous.window(key);
  if (window == lane.rendezvous.windows.end() || !lane.conduit) return;  // its lane closed and released it
  ChunkRef done = window->chunk;
  done.answer = withdrawn ? ChunkRef::kWriteHere : ChunkRef::kDropped;
  queueControlLocked(lane, FrameType::kReceiveDone, encodeChunkRef(done));
  if (withdrawn) return;
  lane.conduit->release(window->handle);
  lane.rendezvous.windows.erase(window);
  box.exposed--;
}

// Receiver: a chunk's header after its bytes were written into an
// announced receive.
bool LaneDevice::onPrewrittenLocked(Lane& lane, const CallSignature* signature) {
  const FrameHeader h = lane.frame;
  const MemberId remote = lane.key.remote;
  const InboxKey key{h.epoch, remote, h.seq, h.tag};
  auto it = messages_.find(key);
  if (it == messages_.end() || it->second.readyLane < 0) {
    // Its receive was dropped and the window released: the write went into
    // memory kept for it, and the chunk is forgotten.
    stats_.staleFramesDropped++;
    log::trace("rendezvous: dropped op {:#x} tag {} offset {} from {}, written into a withdrawn receive", h.seq, h.tag,
               h.offset, labelLocked(remote));
    return true;
  }
  const uint64_t token = lane.token;
  if (!placeDataFrameLocked(lane, signature) || lane.token != token) return false;
  if (lane.discarding) return true;  // stale, or the receive failed on it
  lane.discarding = true;            // nothing follows on the lane
  it = messages_.find(key);
  if (it == messages_.end()) return true;
  it->second.received += h.length;
  stats_.bytesReceived += h.length;
  stats_.zeroCopyChunksReceived++;
  log::trace("rendezvous: op {:#x} tag {} offset {} ({} B) from {} landed unasked", h.seq, h.tag, h.offset, h.length,
             labelLocked(remote));
  messageArrivedLocked(it, labelLocked(remote));
  return lane.token == token;
}

// Sender: a large chunk goes straight into an announced receive when there
// is one.
bool LaneDevice::takeReceiveReadyLocked(Lane& lane, SendItem& item) {
  Peer& p = peers_[lane.key.remote];
  auto ready = p.receiveReady.find(readyKey(item.chunk));
  // A receive of another size refuses the message (the receiver fails it):
  // none of it is written there.
  if (ready == p.receiveReady.end() || ready->second.closed || ready->second.length != item.messageBytes ||
      item.chunk.offset + item.length > ready->second.length)
    return false;
  if (!(item.pinned = lane.conduit->pin(item.data, item.length))) return false;
  item.rendezvous = item.prewritten = item.intoAnnounced = true;
  item.pinnedFrom = item.data;
  item.chunk.address = ready->second.address + item.chunk.offset;
  item.chunk.key = ready->second.key;
  ready->second.writes++;
  markRendezvous(item.header, true, FrameHeader::kPrewritten);
  return true;
}

// Sender: a chunk the receiver cleared into an announced window (it was
// offered before the announcement came) counts against that window too.
void LaneDevice::countClearedWriteLocked(Lane& lane, SendItem& item) {
  Peer& p = peers_[lane.key.remote];
  auto ready = p.receiveReady.find(readyKey(item.chunk));
  if (ready == p.receiveReady.end() || ready->second.key != item.chunk.key) return;
  item.intoAnnounced = true;
  ready->second.writes++;
}

void LaneDevice::onReceiveReadyLocked(Lane& lane) {
  const ChunkRef ready = decodeChunkRef(lane.control.data());
  Peer& p = peers_[lane.key.remote];
  if (!opt_.zeroCopy) return;  // never used: its window closes when the message arrived by the lane
  Peer::ReceiveReady entry{ready.address, ready.key, ready.length};
  if (ready.offset != 0 || ready.length == 0 || ready.answer != ChunkRef::kWriteHere ||
      !FrameHeader::isCollective(ready.seq) || !p.receiveReady.emplace(readyKey(ready), entry).second) {
    stats_.framesRejected++;
    failPeerLocked(lane.key.remote, ecclRemoteError,
                   fmt::format("peer {} announced a receive on lane {} that cannot be one (op {:#x} tag {} offset {}, "
                               "{} bytes, answer {}, or announced twice); connection dropped",
                               p.label, lane.key.lane, ready.seq, ready.tag, ready.offset, ready.length, ready.answer),
                   true);
    return;
  }
  stats_.announcementsHeard++;
  log::trace("rendezvous: {} announced op {:#x} tag {} ({} B) on lane {}", p.label, ready.seq, ready.tag, ready.length,
             lane.key.lane);
}

void LaneDevice::onReceiveDoneLocked(Lane& lane) {
  ChunkRef done = decodeChunkRef(lane.control.data());
  Peer& p = peers_[lane.key.remote];
  if (done.answer != ChunkRef::kDropped && done.answer != ChunkRef::kWriteHere) {
    stats_.framesRejected++;
    failPeerLocked(lane.key.remote, ecclRemoteError,
                   fmt::format("peer {} closed an announced receive on lane {} with answer {}; connection dropped",
                               p.label, lane.key.lane, done.answer),
                   true);
    return;
  }
  const bool answer = done.answer == ChunkRef::kWriteHere;
  auto ready = p.receiveReady.find(readyKey(done));
  if (ready != p.receiveReady.end()) {
    ready->second.closed = true;
    ready->second.answer = answer;
    if (ready->second.writes > 0) return;  // prewriteFinishedLocked answers
    p.receiveReady.erase(ready);
  }
  log::trace("rendezvous: {} closed op {:#x} tag {} ({})", p.label, done.seq, done.tag,
             answer ? "withdrawn" : "arrived");
  if (answer) queueControlLocked(lane, FrameType::kReceiveReleased, encodeChunkRef(done));
}

// Sender: one of its writes into an announced receive completed.
void LaneDevice::prewriteFinishedLocked(Lane& lane, const ChunkRef& chunk) {
  auto peer = peers_.find(lane.key.remote);
  if (peer == peers_.end()) return;
  Peer& p = peer->second;
  auto ready = p.receiveReady.find(readyKey(chunk));
  if (ready == p.receiveReady.end() || --ready->second.writes > 0 || !ready->second.closed) return;
  const bool answer = ready->second.answer;
  p.receiveReady.erase(ready);
  if (!answer) return;
  ChunkRef released = chunk;
  released.offset = 0;
  released.answer = ChunkRef::kWriteHere;
  // Any live lane: the write completed, so its bytes are in place whatever
  // connection says so.
  for (auto& other : p.lanes)
    if (other->conduit) {
      queueControlLocked(*other, FrameType::kReceiveReleased, encodeChunkRef(released), /*flush=*/false);
      return;
    }
}

// Receiver: the sender will not write into a withdrawn receive again.
void LaneDevice::onReceiveReleasedLocked(Lane& lane) {
  const ChunkRef released = decodeChunkRef(lane.control.data());
  const MemberId remote = lane.key.remote;
  const InboxKey key{released.epoch, remote, released.seq, released.tag};
  if (auto box = messages_.find(key); box != messages_.end() && box->second.readyLane >= 0) {
    stats_.framesRejected++;
    failPeerLocked(remote, ecclRemoteError,
                   fmt::format("peer {} released a receive on lane {} that was not withdrawn (op {:#x} tag {}); "
                               "connection dropped",
                               labelLocked(remote), lane.key.lane, released.seq, released.tag),
                   true);
    return;
  }
  for (auto& other : peers_[remote].lanes) {
    auto window = other->rendezvous.window(key);
    if (window == other->rendezvous.windows.end()) continue;
    if (other->conduit) other->conduit->release(window->handle);
    other->rendezvous.windows.erase(window);
    log::trace("rendezvous: {} released op {:#x} tag {}", labelLocked(remote), key.seq, key.tag);
    receiveWindowGoneLocked(key);
    return;
  }
}

// A withdrawn receive (draining) is looked for first: the rest of a
// refused message may have opened a new unexpected one under its key.
void LaneDevice::receiveWindowGoneLocked(const InboxKey& key) {
  std::optional<Draining> drained;
  if (messages_.finishDrainingOne(key, &drained)) {
    if (drained && drained->request) completeLocked(drained->request, drained->code, drained->reason);
    return;
  }
  if (auto box = messages_.find(key); box != messages_.end() && box->second.exposed > 0) {
    box->second.exposed--;
    box->second.readyLane = -1;
  }
}

}  // namespace eccl::transport::lanes
