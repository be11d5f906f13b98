// One communicator's boundary-send log: which peers' sends are teed into
// the store, the current tag, each peer's record numbers, and the records
// of sends still in flight. The communicator calls it around every send to
// a logged peer, on every view change and for replay; it never calls the
// communicator (replay sends through the functions it is given).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "eccl.h"
#include "log/log_store.h"
#include "transport/transport.h"

namespace eccl::log {

class SenderLog {
 public:
  // Validates like the API (throws eccl::Error); capacity 0 turns logging off.
  void configure(const ecclLogConfig_t& config, int nranks);
  bool logsTo(int peer) const;
  void setTag(int64_t iteration, int32_t microbatch) { tag_ = {iteration, microbatch}; }
  size_t truncate(int64_t iteration);
  size_t discardFrom(int64_t iteration);
  void fillStats(ecclLogStats_t* out) const;
  void read(int peer, size_t index, ecclLogRecord_t* record, void* buffer, size_t bufferBytes) const;

  // A send to a logged peer, in three steps around posting it: room first
  // (a full log under the error policy fails the send before anything
  // leaves), then the copy, checksummed chunk by chunk with `between` run
  // after each (the caller keeps its transfer moving), then the outcome.
  LogStore::Reservation reserve(uint32_t epoch, int peer, ecclDataType_t type, size_t bytes, Deadline deadline,
                                const std::string& what);
  void abandon(const LogStore::Reservation& reservation) { store_->abandon(reservation); }
  void copy(const transport::Request* send, const LogStore::Reservation& reservation, const void* buf, size_t bytes,
            const std::function<void()>& between);
  // The send completed (kept) or failed (dropped); a send not logged is ignored.
  void settle(const transport::Request* send, bool ok);

  // After a view change: records follow their peers from `before` to
  // `after` (logs are keyed by rank; a replacement keeps the rank, a
  // shrink moves it, a leaver's records go).
  void renumber(const std::vector<transport::MemberId>& before, const std::vector<transport::MemberId>& after);

  using Send = std::function<transport::RequestPtr(const uint8_t* payload, size_t bytes, const uint32_t* crc)>;
  using Wait = std::function<void(const transport::RequestPtr&, const std::string& what)>;
  // Re-sends the records for `peer` with iterations in [from, to] in order,
  // each with its CRC32C; returns how many.
  size_t replay(int peer, int64_t fromIteration, int64_t toIteration, const Send& send, const Wait& wait);

  LogStore* store() { return store_.get(); }

 private:
  std::unique_ptr<LogStore> store_;
  bool allPeers_ = false;
  std::vector<int> peers_;
  Tag tag_;
  std::map<int, uint64_t> seq_;  // per peer rank, across views
  struct InFlight {
    LogStore::Reservation reservation;
    uint32_t crc = 0;
  };
  std::map<const transport::Request*, InFlight> inFlight_;
};

}  // namespace eccl::log
