// One frame a lane is sending: its header, its payload (the caller's bytes
// or a copy the lane owns) and, for a zero-copy chunk, what the rendezvous
// needs. Queued per lane under the device lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "transport/frame.h"
#include "transport/transport.h"

namespace eccl::transport::lanes {

struct SendItem {
  uint8_t header[FrameHeader::kSize + FrameHeader::kSignatureBytes];
  size_t headerBytes = FrameHeader::kSize;  // with the call signature, when there is one
  const uint8_t* data = nullptr;
  size_t length = 0;
  size_t done = 0;  // bytes written, header included
  RequestPtr request;  // null for control frames
  std::vector<uint8_t> owned;  // control payloads
  // Zero-copy: the header went out alone and the chunk follows by
  // Conduit::writeZeroCopy from the pinned pages once the receiver clears
  // it (or on the lane, if the receiver asks for that).
  bool rendezvous = false;
  uint64_t pinned = 0;                  // Conduit::pin's handle
  const uint8_t* pinnedFrom = nullptr;  // the chunk's first byte in the pinned buffer
  ChunkRef chunk;      // which chunk it is; where to write it, once cleared
  // Written into the window the receiver announced (kReceiveReady): no
  // clearance is asked; the header follows the write as kPrewritten.
  bool prewritten = false;
  // Written into an announced receive's window, unasked or cleared into it:
  // the sender releases a withdrawn window only once such writes are done.
  bool intoAnnounced = false;
  uint64_t messageBytes = 0;  // the whole message's length (an announced receive must match it)
  uint64_t ticket = 0; // its write's number on the lane (0: not started)
  // A zero-copy write and the frame that tells the receiver it landed
  // (kLanded, or the header of a prewritten chunk) share this number
  // (LaneRendezvous::notices): the send completes only once that frame is
  // on the lane, so a sender that exits after its sends completed leaves
  // nothing the receiver still needs in its own queue.
  uint64_t notice = 0;
  // Keeps the bytes after the request failed or was cancelled (the frame
  // must still be whole on the wire, or its chunk still sent; a pinned
  // buffer's pages stay readable through the pin).
  void detach() {
    owned.assign(data, data + length);
    data = owned.data();
    request.reset();
  }
};

}  // namespace eccl::transport::lanes
