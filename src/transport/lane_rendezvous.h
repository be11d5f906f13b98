// The rendezvous on one lane (zero-copy chunks, Conduit::zeroCopyMinBytes):
// sending, our chunks whose header went out until the receiver clears them
// and the cleared ones until their writes finish; receiving, the chunks we
// exposed to the peer until it says they landed, and whole posted receives
// announced to it (kReceiveReady) until their message came or the peer let
// a withdrawn one go. Each queue is in the order the other side answers.
// One per lane, touched under the device lock; what a closed lane leaves
// for the device to settle is handed over by close().
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <vector>

#include "transport/conduit.h"
#include "transport/frame.h"
#include "transport/message_table.h"
#include "transport/send_item.h"

namespace eccl::transport::lanes {

struct Exposure {
  InboxKey key;
  ChunkRef chunk;
  uint64_t handle;  // Conduit::expose's (0: the announced window's)
};

struct LaneRendezvous {
  std::deque<SendItem> awaitingClearance;
  // Cleared chunks until their writes finish (ticket 0: not started, held
  // back one pass or waiting for a send slot).
  std::deque<SendItem> writes;
  uint64_t started = 0;  // writes started on the lane (SendItem::ticket's last)
  uint64_t noticesQueued = 0, noticesWritten = 0;  // SendItem::notice
  // Cleared writes left unstarted by the one-write-per-pass rule
  // (startZeroCopyWriteLocked): the device must come back to them, not sleep.
  bool heldBack = false;
  // A write runs with the device lock released (writeHeldZeroCopyLocked).
  bool writing = false;
  std::deque<Exposure> exposures;
  std::deque<Exposure> windows;  // announced whole receives

  std::deque<Exposure>::iterator window(const InboxKey& key) {
    return std::find_if(windows.begin(), windows.end(), [&](const Exposure& e) { return e.key == key; });
  }
  // A cleared write waits for a send slot (not for a completion, which the
  // armed conduit announces).
  bool wantsSlot() const { return !writes.empty() && writes.back().ticket == 0; }
  // Something of the peer's or ours is in flight (an RDMA poll is worth it).
  bool busy() const { return !awaitingClearance.empty() || !writes.empty() || !exposures.empty(); }

  // What a closed connection leaves: chunks exposed to the peer that will
  // never land, windows it will never write, and our writes into announced
  // receives whose completions will not come.
  struct Closed {
    std::deque<Exposure> exposures;
    std::deque<Exposure> windows;
    std::vector<ChunkRef> prewrites;
  };
  // Releases every registration on `conduit` (still open) and starts over.
  Closed close(Conduit& conduit) {
    Closed closed{std::move(exposures), std::move(windows), {}};
    for (const SendItem& item : writes)
      if (item.intoAnnounced) closed.prewrites.push_back(item.chunk);
    for (const Exposure& e : closed.windows) conduit.release(e.handle);
    for (const Exposure& e : closed.exposures) conduit.release(e.handle);
    for (auto* queue : {&awaitingClearance, &writes})
      for (const SendItem& item : *queue) conduit.release(item.pinned);
    *this = LaneRendezvous{};
    return closed;
  }
};

}  // namespace eccl::transport::lanes
