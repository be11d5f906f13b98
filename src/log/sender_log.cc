#include "log/sender_log.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>

#include "common/copy.h"
#include "common/crypto.h"
#include "common/error.h"
#include "common/log.h"
#include "common/types.h"

namespace eccl::log {
void SenderLog::configure(const ecclLogConfig_t& c, int nranks) {
  ECCL_CHECK_ARG(inFlight_.empty(), "ecclLogConfigure: {} logged send(s) are still in flight", inFlight_.size());
  ECCL_CHECK_ARG(c.whenFull >= ecclLogOnFullError && c.whenFull <= ecclLogOnFullEvict,
                 "ecclLogConfigure: invalid full policy {}", static_cast<int>(c.whenFull));
  ECCL_CHECK_ARG(c.numPeers >= 0 && (c.peers || c.numPeers == 0),
                 "ecclLogConfigure: peers is NULL with numPeers={} (NULL and 0 log every peer)", c.numPeers);
  std::vector<int> peers(c.peers, c.peers + c.numPeers);
  for (int p : peers) ECCL_CHECK_ARG(p >= 0 && p < nranks, "ecclLogConfigure peer: rank {} is outside [0, {})", p, nranks);
  if (c.capacityBytes == 0) {
    store_.reset();
    peers_.clear();
    allPeers_ = false;
    return;
  }
  auto policy = c.whenFull == ecclLogOnFullBlock   ? FullPolicy::kBlock
                : c.whenFull == ecclLogOnFullEvict ? FullPolicy::kEvict
                                                   : FullPolicy::kError;
  try {
    store_ = std::make_unique<LogStore>(c.capacityBytes, policy);
  } catch (const std::bad_alloc&) {
    fail(ecclSystemError, "ecclLogConfigure: cannot allocate a log of {} bytes", c.capacityBytes);
  }
  peers_ = std::move(peers);
  allPeers_ = c.peers == nullptr;
  log::info("logging sends to {} in {} bytes", allPeers_ ? std::string("every peer") : fmt::format("ranks {}", fmt::join(peers_, ",")),
            c.capacityBytes);
}

bool SenderLog::logsTo(int peer) const {
  if (!store_) return false;
  return allPeers_ || std::count(peers_.begin(), peers_.end(), peer) > 0;
}

size_t SenderLog::discardFrom(int64_t iteration) {
  ECCL_CHECK_ARG(store_ != nullptr, "ecclLogDiscard: logging is not configured (ecclLogConfigure)");
  return store_->discardFrom(iteration);
}

size_t SenderLog::truncate(int64_t iteration) {
  ECCL_CHECK_ARG(store_ != nullptr, "ecclLogTruncate: logging is not configured (ecclLogConfigure)");
  return store_->truncate(iteration);
}

void SenderLog::fillStats(ecclLogStats_t* out) const {
  ecclLogStats_t s{};
  s.size = out->size;
  s.oldestIteration = s.newestIteration = -1;
  s.oldestMicrobatch = s.newestMicrobatch = -1;
  if (store_) {
    StoreStats st = store_->stats();
    s.records = st.records;
    s.bytes = st.bytes;
    s.capacityBytes = store_->capacity();
    if (st.oldest) s.oldestIteration = st.oldest->iteration, s.oldestMicrobatch = st.oldest->microbatch;
    if (st.newest) s.newestIteration = st.newest->iteration, s.newestMicrobatch = st.newest->microbatch;
    s.evictions = st.evictions;
    s.gaps = st.gaps;
  }
  std::memcpy(out, &s, std::min(out->size, sizeof(s)));
}

void SenderLog::read(int peer, size_t index, ecclLogRecord_t* record, void* buffer, size_t bufferBytes) const {
  ECCL_CHECK_ARG(store_ != nullptr, "ecclLogRead: logging is not configured (ecclLogConfigure)");
  const uint8_t* payload = nullptr;
  RecordInfo info = store_->read(peer, index, &payload);
  ecclLogRecord_t r{};
  r.size = record->size;
  r.epoch = info.epoch;
  r.peer = info.peer;
  r.iteration = info.tag.iteration;
  r.microbatch = info.tag.microbatch;
  r.seq = info.seq;
  r.datatype = info.type;
  r.count = info.count;
  r.crc32c = info.crc;
  std::memcpy(record, &r, std::min(record->size, sizeof(r)));
  if (buffer) {
    ECCL_CHECK_ARG(bufferBytes >= info.bytes, "ecclLogRead: the record holds {} bytes, the buffer {}", info.bytes,
                   bufferBytes);
    if (info.bytes) copyBytes(buffer, payload, info.bytes);
  }
}

LogStore::Reservation SenderLog::reserve(uint32_t epoch, int peer, ecclDataType_t type, size_t bytes,
                                         Deadline deadline, const std::string& what) {
  RecordInfo info;
  info.epoch = epoch;
  info.peer = peer;
  info.tag = tag_;
  info.seq = seq_[peer] + 1;
  info.type = type;
  info.count = bytes / typeSize(type);
  info.bytes = bytes;
  LogStore::Reservation reservation =
      store_->reserve(info, deadline, fmt::format("{} (iteration {} micro-batch {})", what, tag_.iteration, tag_.microbatch));
  seq_[peer]++;
  return reservation;
}

// The copy and its checksum overlap the network send (both only read buf);
// the checksum reads each chunk while it is still in cache.
void SenderLog::copy(const transport::Request* send, const LogStore::Reservation& reservation, const void* buf,
                     size_t bytes, const std::function<void()>& between) {
  constexpr size_t kChunk = 64 << 10;
  uint32_t crc = 0;
  for (size_t off = 0; off < bytes; off += kChunk) {
    size_t n = std::min(kChunk, bytes - off);
    copyBytes(reservation.data + off, static_cast<const uint8_t*>(buf) + off, n);
    crc = crc32c(reservation.data + off, n, crc);
    between();
  }
  inFlight_[send] = {reservation, crc};
}

void SenderLog::settle(const transport::Request* send, bool ok) {
  auto it = inFlight_.find(send);
  if (it == inFlight_.end()) return;
  if (ok)
    store_->commit(it->second.reservation, it->second.crc);
  else
    store_->abandon(it->second.reservation);
  inFlight_.erase(it);
}

void SenderLog::renumber(const std::vector<transport::MemberId>& before, const std::vector<transport::MemberId>& after) {
  std::vector<int> newRank(before.size(), -1);
  bool moved = false;
  for (size_t r = 0; r < before.size(); ++r) {
    auto it = std::find(after.begin(), after.end(), before[r]);
    // A member replaced by a standby keeps its rank: the log addresses the
    // newcomer, which is what replay to a replacement needs.
    newRank[r] = it != after.end() ? static_cast<int>(it - after.begin()) : (r < after.size() ? -2 : -1);
  }
  // -2: the member left but its rank survives. Under a replacement that rank
  // is the newcomer's; under a shrink it belongs to whoever moved into it,
  // and the leaver's records must go.
  std::vector<bool> taken(after.size(), false);
  for (int nr : newRank)
    if (nr >= 0) taken[nr] = true;
  for (size_t r = 0; r < newRank.size(); ++r) {
    if (newRank[r] == -2) newRank[r] = taken[r] ? -1 : static_cast<int>(r);
    moved = moved || newRank[r] != static_cast<int>(r);
  }
  if (!moved) return;
  auto mapped = [&](int peer) { return peer >= 0 && peer < static_cast<int>(newRank.size()) ? newRank[peer] : -1; };
  if (store_) store_->renumberPeers(newRank);
  std::vector<int> peers;
  for (int p : peers_)
    if (mapped(p) >= 0) peers.push_back(mapped(p));
  peers_ = std::move(peers);
  std::map<int, uint64_t> seqs;
  for (auto& [peer, seq] : seq_)
    if (mapped(peer) >= 0) seqs[mapped(peer)] = seq;
  seq_ = std::move(seqs);
  log::info("boundary-send logs renumbered for the new view");
}

// Posted together and waited in order. Replayed records are not logged
// again. The payloads are sent from the arena, so nothing may send (and
// evict) or truncate meanwhile: like every call on a communicator, replay
// is not to be overlapped from another thread.
size_t SenderLog::replay(int peer, int64_t fromIteration, int64_t toIteration, const Send& send, const Wait& wait) {
  ECCL_CHECK_ARG(store_ != nullptr, "ecclLogReplay: logging is not configured (ecclLogConfigure)");
  ECCL_CHECK_ARG(logsTo(peer), "ecclLogReplay: sends to rank {} are not logged (the configured peers are {})", peer,
                 allPeers_ ? std::string("all") : fmt::format("{}", fmt::join(peers_, ",")));
  std::vector<const uint8_t*> payloads;
  std::vector<RecordInfo> records = store_->select(peer, fromIteration, toIteration, &payloads);
  std::vector<transport::RequestPtr> requests;
  for (size_t i = 0; i < records.size(); ++i) requests.push_back(send(payloads[i], records[i].bytes, &records[i].crc));
  for (size_t i = 0; i < requests.size(); ++i)
    wait(requests[i], fmt::format("log replay to rank {} (record {} of {}: iteration {} micro-batch {})", peer, i + 1,
                                  requests.size(), records[i].tag.iteration, records[i].tag.microbatch));
  return records.size();
}

}  // namespace eccl::log
