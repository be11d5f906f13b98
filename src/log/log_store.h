// The boundary-send log: what this rank sent to chosen peers since the last
// durable checkpoint, in one preallocated host arena (a ring of records in
// send order), tagged by iteration and micro-batch, checksummed (CRC32C),
// truncated from the oldest end, and read back for replay. No allocation
// per record on the hot path: the arena and the record ring are sized once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/crypto.h"
#include "common/mutex.h"
#include "eccl.h"

namespace eccl::log {

enum class FullPolicy { kError, kBlock, kEvict };

struct Tag {
  int64_t iteration = 0;
  int32_t microbatch = 0;
  auto operator<=>(const Tag&) const = default;
};

struct RecordInfo {
  uint32_t epoch = 0;
  int peer = -1;
  Tag tag;
  uint64_t seq = 0;  // per peer, in send order
  ecclDataType_t type = ecclUint8;
  size_t count = 0;
  size_t bytes = 0;
  uint32_t crc = 0;  // CRC32C of the payload
};

struct StoreStats {
  uint64_t records = 0, bytes = 0;
  std::optional<Tag> oldest, newest;
  uint64_t evictions = 0;  // records dropped by the evict policy
  uint64_t gaps = 0;       // peers whose log has an evicted hole
};

class LogStore {
 public:
  LogStore(size_t capacityBytes, FullPolicy policy);
  LogStore(const LogStore&) = delete;
  LogStore& operator=(const LogStore&) = delete;

  // Makes room for one record (error: throws ecclLogFull and records
  // nothing; block: waits for a truncate until the deadline; evict: drops
  // the oldest records and remembers the gap) and returns where its payload
  // goes. commit() publishes it; abandon() (the send failed) drops it.
  struct Reservation {
    uint64_t id = 0;
    uint8_t* data = nullptr;
  };
  Reservation reserve(const RecordInfo& info, Deadline deadline, const std::string& what);
  void commit(const Reservation& r, uint32_t crc);
  void abandon(const Reservation& r);

  // Frees every record older than `iteration` (a prefix of the log when
  // iterations are tagged in order), in time proportional to what it frees.
  size_t truncate(int64_t iteration);
  // Drops every record of `iteration` or later (an iteration a failure
  // interrupted is redone: its first attempt must never be replayed);
  // returns how many. Space at the head of the log is reclaimed at once,
  // the rest when truncation reaches it.
  size_t discardFrom(int64_t iteration);

  // The committed records for `peer` with iteration in [from, to], in send
  // order. Throws ecclInvalidUsage naming the range if part of it was
  // truncated or evicted (never returns partial data as whole).
  std::vector<RecordInfo> select(int peer, int64_t from, int64_t to, std::vector<const uint8_t*>* payloads) const;
  // One record by its position among `peer`'s committed records.
  RecordInfo read(int peer, size_t index, const uint8_t** payload) const;

  // A view change that renumbered ranks (shrink): `newRank[old]` is the
  // peer's rank in the new view, or -1 if it left. Records for a peer that
  // left can never be replayed to anyone and are dropped (their arena space
  // is reclaimed when truncation reaches them); the others follow their
  // peer to its new rank. Pending records (a send in flight) keep their rank.
  void renumberPeers(const std::vector<int>& newRank);

  StoreStats stats() const;
  size_t capacity() const { return arena_.size(); }

 private:
  struct Record;

 public:
  // What the log keeps per record besides the payload.
  static const size_t kRecordOverheadBytes;

 private:
  struct Record {
    RecordInfo info;
    size_t offset = 0;
    size_t footprint = 0;  // bytes of the arena it holds (incl. a skipped tail)
    uint64_t id = 0;
    enum class State { kPending, kCommitted, kAbandoned } state = State::kPending;
  };
  bool fitsLocked(size_t bytes, size_t* offset, size_t* footprint) const ECCL_REQUIRES(mu_);
  void popOldestLocked(bool evicting) ECCL_REQUIRES(mu_);
  void reclaimAbandonedHeadLocked() ECCL_REQUIRES(mu_);

  std::vector<uint8_t> arena_;
  const FullPolicy policy_;
  mutable Mutex mu_;
  CondVar freed_;
  std::deque<Record> records_ ECCL_GUARDED_BY(mu_);  // send order
  size_t head_ ECCL_GUARDED_BY(mu_) = 0;             // next free byte
  size_t used_ ECCL_GUARDED_BY(mu_) = 0;             // bytes held, skipped tails included
  uint64_t nextId_ ECCL_GUARDED_BY(mu_) = 1;
  uint64_t evictions_ ECCL_GUARDED_BY(mu_) = 0;
  int64_t truncatedBefore_ ECCL_GUARDED_BY(mu_) = INT64_MIN;
  std::map<int, Tag> evictedThrough_ ECCL_GUARDED_BY(mu_);  // per peer: newest evicted tag
};

}  // namespace eccl::log
