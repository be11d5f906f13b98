// A coordinator connection after the handshake: every message is sealed
// with HMAC-SHA256 under the connection's session key over (direction,
// message number, SHA-256 of the body), so a message cannot be forged,
// altered, replayed or reordered by anyone without the job secret. The
// body is hashed first so that entries shared by the messages of a
// broadcast are hashed once (coord_messages.h), not once per member.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "membership/coord_messages.h"
#include "membership/unique_id.h"
#include "common/clock.h"
#include "common/crypto.h"
#include "common/socket.h"

namespace eccl::membership {

// A message encoded and hashed once, to be sealed for any number of
// connections (a broadcast): sealing it is then one short HMAC each.
struct EncodedMessage {
  CoordKind kind = CoordKind::kHeartbeat;
  std::shared_ptr<const EncodedEntries> entries;  // on the wire first; may be null (then in `rest`)
  std::vector<uint8_t> rest;
  Digest digest{};  // SHA-256 of the whole body
};
EncodedMessage encodeForSealing(const CoordMessage& m);

class SealedChannel {
 public:
  SealedChannel(Fd fd, const Secret& key, bool isServer, std::string peer);
  int fd() const { return fd_.get(); }
  const std::string& peer() const { return peer_; }
  void setPeer(std::string peer) { peer_ = std::move(peer); }

  // Blocking; throws eccl::Error naming the peer.
  void send(const CoordMessage& m, Deadline deadline);
  // Blocks until one message is whole; throws on deadline, EOF, bad seal.
  CoordMessage receive(Deadline deadline);
  // Reads what is available without blocking and appends whole messages.
  // Returns false at end of file. Throws on a bad seal, a malformed message
  // or a failed receive (a reset), after appending the messages that were
  // whole before it.
  bool drain(std::vector<CoordMessage>* out);

  // Sending without blocking (the coordinator's loop): enqueue() seals the
  // message behind those already queued and returns false, queueing
  // nothing, when more than `limit` bytes would wait (a peer that has read
  // nothing for that long is stopped or gone); flush() writes what the
  // socket takes now and throws, naming the peer, when it broke.
  bool enqueue(const EncodedMessage& m, size_t limit);
  bool enqueue(const CoordMessage& m, size_t limit) { return enqueue(encodeForSealing(m), limit); }
  void flush();
  size_t queuedBytes() const { return queued_; }

 private:
  // A message on its way out: its own bytes, and entries it shares with
  // other connections' messages, sent from the one copy.
  struct Piece {
    std::vector<uint8_t> own;
    std::shared_ptr<const EncodedEntries> shared;
    size_t size() const { return shared ? shared->bytes.size() : own.size(); }
    const uint8_t* data() const { return shared ? shared->bytes.data() : own.data(); }
  };
  // Length, body (the entries first) and seal, in order.
  std::vector<Piece> frame(const EncodedMessage& m);
  void takeWhole();
  bool readAvailable();  // false at end of file

  Fd fd_;
  Secret key_;
  uint8_t sendDir_, recvDir_;
  uint64_t sent_ = 0, received_ = 0;
  std::string peer_;
  std::vector<uint8_t> inbuf_;
  std::deque<Piece> out_;
  size_t outSent_ = 0;  // bytes of out_.front() already written
  size_t queued_ = 0;   // bytes in out_ not yet written
  std::deque<CoordMessage> ready_;
};

// Connects to whichever of the job's coordinators listens (replicas that
// do not lead refuse connections), trying each in turn until the deadline.
Fd connectToCoordinator(const UniqueIdData& id, Deadline deadline, const std::string& what);
// "the coordinator at A" or, replicated, "the coordinator at A, B or C".
std::string coordinatorLabel(const UniqueIdData& id);

}  // namespace eccl::membership
