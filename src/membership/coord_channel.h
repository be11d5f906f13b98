// A coordinator connection after the handshake: every message is sealed
// with HMAC-SHA256 under the connection's session key over (direction,
// message number, body), so a message cannot be forged, altered, replayed
// or reordered by anyone without the job secret.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "membership/coord_messages.h"
#include "membership/unique_id.h"
#include "common/clock.h"
#include "common/crypto.h"
#include "common/socket.h"

namespace eccl::membership {

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
  bool enqueue(const CoordMessage& m, size_t limit);
  void flush();
  size_t queuedBytes() const { return outbuf_.size() - outSent_; }

 private:
  std::vector<uint8_t> frame(const CoordMessage& m);
  void takeWhole();
  bool readAvailable();  // false at end of file

  Fd fd_;
  Secret key_;
  uint8_t sendDir_, recvDir_;
  uint64_t sent_ = 0, received_ = 0;
  std::string peer_;
  std::vector<uint8_t> inbuf_;
  std::vector<uint8_t> outbuf_;
  size_t outSent_ = 0;  // bytes of outbuf_ already written
  std::deque<CoordMessage> ready_;
};

// Connects to whichever of the job's coordinators listens (replicas that
// do not lead refuse connections), trying each in turn until the deadline.
Fd connectToCoordinator(const UniqueIdData& id, Deadline deadline, const std::string& what);
// "the coordinator at A" or, replicated, "the coordinator at A, B or C".
std::string coordinatorLabel(const UniqueIdData& id);

}  // namespace eccl::membership
