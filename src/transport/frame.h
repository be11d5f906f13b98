// The wire frame: a fixed 64-byte little-endian header, then `length`
// payload bytes. Every data frame carries the sender's epoch, the
// communicator id and the op it belongs to, so a receiver can drop stale
// traffic and match chunks of striped messages to posted receives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace eccl::transport {

enum class FrameType : uint8_t {
  kData = 1,     // payload is a chunk of a message at `offset` of `total`
  kGoodbye = 2,  // orderly close: the sender destroyed its communicator (payload: nothing, or
                 // 24 bytes per recent collective of the frame's epoch: u64 op, its call signature)
  kNotice = 3,   // payload: u64 failed member, then a UTF-8 reason
  kPing = 4,     // liveness probe, answered by the peer's progress thread; payload: nothing, or
                 // u64 the collective the sender waits on
  kPong = 5,     // payload: nothing, or u64 that collective then (if the peer has started it) its
                 // call signature, so ranks that disagree without exchanging data still find out
  kRevoke = 6,   // payload: u64 first revoked op, u32 result code, then a UTF-8 reason
  kClearToSend = 7,  // payload: ChunkRef, where the receiver wants a zero-copy chunk written
  kLanded = 8,       // payload: ChunkRef, the sender wrote that chunk (behind it on the lane)
  // A collective's posted receive, announced before its message comes (a
  // receiver-driven rendezvous): payload ChunkRef of the whole receive
  // (offset 0, length its size, where to write it). The sender writes its
  // large chunks there without asking (kPrewritten).
  kReceiveReady = 9,
  // Receiver: forget that receive's window. answer kDropped: its message
  // arrived; kWriteHere: it was withdrawn (revoked, superseded), answer
  // with kReceiveReleased once no write into it is under way.
  kReceiveDone = 10,
  kReceiveReleased = 11,  // payload: the ChunkRef of the withdrawn receive
  // Receiver: payload u64, the payload bytes of kBulkCredit frames read on
  // this lane so far; the sender's bulk admission on a back end that cannot
  // see its peer's reads (LaneDevice::bulkRoomLocked).
  kBulkRead = 12,
  // A rank refused its part of a collective (its arguments failed a check
  // there) and took the op's number: payload u64 op, then a UTF-8 reason.
  // Each receiver fails its own part of that op with the reason and passes
  // the word on to its peers, so no rank waits for data that never comes
  // and every rank's next call still matches.
  kRefused = 13,
};

// Names one chunk of a message (the data frame's epoch, op, tag, offset and
// length) in a rendezvous; a clear-to-send adds the receiver's answer.
struct ChunkRef {
  static constexpr size_t kBytes = 48;
  enum Answer : uint32_t {
    kDropped = 0,     // the receiver dropped the chunk (stale, cancelled): the sender is done with it
    kWriteHere = 1,   // write it at (address, key)
    kSendOnLane = 2,  // the receiver cannot expose the memory: send it as an ordinary frame
  };
  uint32_t epoch = 0;
  uint32_t tag = 0;
  uint64_t seq = 0;
  uint64_t offset = 0;
  uint64_t address = 0;
  uint32_t key = 0;
  uint32_t length = 0;
  uint32_t answer = kDropped;
  bool sameChunk(const ChunkRef& o) const {
    return epoch == o.epoch && tag == o.tag && seq == o.seq && offset == o.offset && length == o.length;
  }
};

struct FrameHeader {
  static constexpr uint32_t kMagic = 0x4C434345;  // "ECCL"
  static constexpr uint16_t kVersion = 1;
  static constexpr size_t kSize = 64;
  static constexpr uint32_t kMaxPayload = 1u << 30;
  static constexpr uint32_t kMaxControlPayload = 4096;

  // flags: kPayloadChecksum means payloadCrc is the CRC32C of the whole
  // message (every chunk carries it); the receiver verifies it.
  static constexpr uint8_t kPayloadChecksum = 1;
  // kCallSignature: CallSignature::kWireBytes of the sender's call
  // signature follow the header (before the payload); signatureCrc is their
  // CRC32C. Set on the first frame of each message of a checked call.
  static constexpr uint8_t kCallSignature = 2;
  static constexpr size_t kSignatureBytes = 16;
  // kRendezvous: the `length` payload bytes do not follow on the lane; the
  // receiver answers with a kClearToSend and the sender writes them into
  // the memory it names (Conduit::writeZeroCopy), then sends kLanded.
  static constexpr uint8_t kRendezvous = 4;
  // kPrewritten: the `length` payload bytes were already written into the
  // window the receiver announced (kReceiveReady), ahead of this header on
  // the same connection; nothing follows on the lane.
  static constexpr uint8_t kPrewritten = 8;
  // kBulkCredit: a bulk frame (Device::isendBulk) on a lane whose back end
  // cannot see what its peer has read (TCP); the receiver counts its
  // payload and reports the count (kBulkRead).
  static constexpr uint8_t kBulkCredit = 16;
  FrameType type = FrameType::kData;
  uint8_t flags = 0;
  uint32_t payloadCrc = 0;
  uint32_t signatureCrc = 0;
  uint32_t epoch = 0;
  uint64_t commId = 0;
  uint64_t seq = 0;    // op sequence number (kP2pBit set for send/recv)
  uint32_t tag = 0;    // step within the op
  uint32_t length = 0; // payload bytes in this frame
  uint64_t offset = 0; // where this chunk lands in the message
  uint64_t total = 0;  // whole message length

  static constexpr uint64_t kP2pBit = 1ull << 63;
  // Membership agreement (the switchover's in-band vote, the leaver's
  // boundary token): a revoked communicator still carries it, so every live
  // member finishes the vote and none waits on a peer that stopped sending
  // because an unrelated failure revoked it. Only the peer's own failure or
  // departure fails it.
  static constexpr uint64_t kAgreementBit = 1ull << 61;
  // Background traffic (snapshot replication), point-to-point: a peer that
  // leaves in order with such an op pending fails only that op; it does
  // not break the view the way a collective or a send/recv that needed the
  // peer does (a standing receive for a next message that never comes is
  // not a need).
  static constexpr uint64_t kBackgroundBit = 1ull << 60;
  static bool isBackground(uint64_t seq) { return (seq & (kP2pBit | kBackgroundBit)) == (kP2pBit | kBackgroundBit); }
  // Background traffic with a process outside the view (a member's
  // recorded outputs for a standby's sandbox): the standby has no epoch of
  // the view, so such messages are matched by no epoch and no view change
  // makes them stale; they end with the receive or the peer.
  static constexpr uint64_t kOutOfViewBit = 1ull << 59;
  static bool isOutOfView(uint64_t seq) { return isBackground(seq) && (seq & kOutOfViewBit); }
  static bool survivesRevocation(uint64_t seq) { return (seq & (kP2pBit | kAgreementBit)) == (kP2pBit | kAgreementBit); }
  static bool isCollective(uint64_t seq) { return (seq & kP2pBit) == 0; }
  size_t extensionBytes() const { return (flags & kCallSignature) ? kSignatureBytes : 0; }
};

void encodeFrame(const FrameHeader& h, uint8_t out[FrameHeader::kSize]);
// Sets or clears kRendezvous (or another flag) on an encoded data frame
// (its CRC follows).
void markRendezvous(uint8_t frame[FrameHeader::kSize], bool on, uint8_t flag = FrameHeader::kRendezvous);

std::vector<uint8_t> encodeChunkRef(const ChunkRef& c);
ChunkRef decodeChunkRef(const uint8_t in[ChunkRef::kBytes]);

// Returns the header, or nullopt with `why` set to the reason the frame is
// rejected (bad magic, version, type, CRC, lengths).
std::optional<FrameHeader> decodeFrame(const uint8_t in[FrameHeader::kSize], std::string* why);

}  // namespace eccl::transport
