// Matching: every message the device is receiving, posted or not, keyed by
// view, peer, operation and tag; the pooled buffers of messages that came
// before their receive; and the dropped receives a peer may still be
// writing into (draining). The device owns one and touches it only under
// its lock (a member guarded by the device mutex); what a match means for
// requests, lanes and peers stays with the device, which is told the
// outcome rather than called back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "transport/device.h"
#include "transport/signature.h"
#include "transport/staging_pool.h"

namespace eccl::transport::lanes {

// One message being received, posted or not.
struct Inbox {
  RequestPtr request;  // null while nobody has posted the receive
  uint8_t* userBuffer = nullptr;
  // Data that arrived before the receive was posted (uninitialised, from
  // the table's pool of staging buffers).
  StagingBuffer staged;
  bool unexpected = false;
  size_t total = 0;
  size_t received = 0;
  bool checksummed = false;  // the sender sent the message's CRC32C
  uint32_t crc = 0;
  // Point-to-point call signatures: the receiver's and the sender's.
  std::optional<CallSignature> expected, sent;
  bool upTo = false;       // irecvUpTo: any message of at most `capacity` bytes
  bool cancelled = false;  // its receive was withdrawn: the message is read and dropped
  uint64_t arrival = 0;    // unexpected: the table's count of such messages when its first frame came
  size_t capacity = 0;
  int exposed = 0;  // zero-copy chunks cleared to the peer and not landed yet, and its window
  // The lane whose connection announced the whole receive to the peer
  // (kReceiveReady), while that window is open; -1: none.
  int readyLane = -1;
  uint8_t* base() { return unexpected ? staged.bytes.get() : userBuffer; }
};

struct InboxKey {
  uint32_t epoch;  // a message belongs to one view; older ones die with it
  MemberId peer;
  uint64_t seq;
  uint32_t tag;
  auto operator<=>(const InboxKey&) const = default;
};

// A receive dropped while the peer could still write into its buffer: the
// buffer and the request's ending wait for the last exposed chunk.
struct Draining {
  RequestPtr request;
  ecclResult_t code = ecclSuccess;
  std::string reason;
  StagingBuffer staged;
  int exposed = 0;
};

class MessageTable {
 public:
  using iterator = std::map<InboxKey, Inbox>::iterator;

  explicit MessageTable(size_t stagingLimitBytes = StagingPool::kLimitBytes) : staging_(stagingLimitBytes) {}

  iterator begin() { return boxes_.begin(); }
  iterator end() { return boxes_.end(); }
  iterator find(const InboxKey& key) { return boxes_.find(key); }
  bool contains(const InboxKey& key) const { return boxes_.contains(key); }
  size_t size() const { return boxes_.size(); }

  // A receive posted before any of its message came.
  Inbox& openPosted(const InboxKey& key, RequestPtr request, uint8_t* buffer, size_t bytes, bool upTo);
  // The first frame of a message nobody has asked for: staged in a pooled
  // buffer and numbered in arrival order. std::bad_alloc when it cannot be
  // staged, with nothing left in the table.
  iterator openUnexpected(const InboxKey& key, size_t total);
  // A message nobody will ever ask for (a refused op's): read and dropped.
  iterator openDiscarded(const InboxKey& key, size_t total);

  // A posted receive matched a whole staged message: its bytes go into the
  // receive's buffer and the staging buffer back to the pool.
  void deliverStaged(Inbox& box);
  // A whole staged message leaves the table with its buffer, for the
  // caller to copy out without the device lock; giveBack returns it.
  StagingBuffer takeStaged(iterator it);
  void giveBack(StagingBuffer& buffer) { staging_.give(buffer); }
  // The staged bytes will never be asked for; the entry stays until the
  // rest of its message is read and dropped.
  void releaseStaging(Inbox& box) { staging_.give(box.staged); }

  // Forgets a message. Its staging buffer goes back to the pool unless a
  // peer may still be writing into it (it is freed with the entry then).
  iterator erase(iterator it);
  void erase(const InboxKey& key);
  // Forgets a message a peer may still write into: it drains until
  // finishDrainingOne has been told of each of its exposed chunks.
  iterator eraseDraining(iterator it, ecclResult_t code, std::string reason);

  // One of a draining receive's exposed chunks or windows is done with.
  // False when `key` is not draining; `finished` gets the entry once its
  // last one is.
  bool finishDrainingOne(const InboxKey& key, std::optional<Draining>* finished);

  // Abort: empties the table and returns every request still pending in
  // it (draining ones included), for the device to end.
  std::vector<RequestPtr> clear();

  // Staged for messages nobody has asked for yet (DeviceStats).
  size_t unexpectedBytesHeld() const;
  const StagingPool& staging() const { return staging_; }
  uint64_t unexpectedArrivals() const { return arrivals_; }
  size_t drainingCount() const { return draining_.size(); }

 private:
  std::map<InboxKey, Inbox> boxes_;
  std::map<InboxKey, Draining> draining_;
  uint64_t arrivals_ = 0;  // unexpected messages so far (Inbox::arrival)
  StagingPool staging_;
};

}  // namespace eccl::transport::lanes
