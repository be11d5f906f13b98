// The communicator's side of the boundary-send log: configuration, tags,
// truncation, statistics, reading a record, and replaying a peer's records
// (the teeing itself is in Communicator::postSend/waitP2p).
#include <algorithm>
#include <cstring>

#include "coll/reduce.h"
#include "common/error.h"
#include "common/log.h"
#include "core/communicator.h"
#include "transport/frame.h"

namespace eccl {

bool Communicator::logsTo(int peer) const {
  if (!log_) return false;
  return logAllPeers_ || std::count(loggedPeers_.begin(), loggedPeers_.end(), peer) > 0;
}

void Communicator::renumberLogs(const std::vector<transport::MemberId>& next) {
  std::vector<int> newRank(view_.rankToMember.size(), -1);
  bool moved = false;
  for (size_t r = 0; r < view_.rankToMember.size(); ++r) {
    auto it = std::find(next.begin(), next.end(), view_.rankToMember[r]);
    // A member replaced by a standby keeps its rank: the log addresses the
    // newcomer, which is what replay to a replacement needs.
    newRank[r] = it != next.end() ? static_cast<int>(it - next.begin()) : (r < next.size() ? -2 : -1);
  }
  // -2: the member left but its rank survives. Under a replacement that rank
  // is the newcomer's; under a shrink it belongs to whoever moved into it,
  // and the leaver's records must go.
  std::vector<bool> taken(next.size(), false);
  for (int nr : newRank)
    if (nr >= 0) taken[nr] = true;
  for (size_t r = 0; r < newRank.size(); ++r) {
    if (newRank[r] == -2) newRank[r] = taken[r] ? -1 : static_cast<int>(r);
    moved = moved || newRank[r] != static_cast<int>(r);
  }
  if (!moved) return;
  auto mapped = [&](int peer) { return peer >= 0 && peer < static_cast<int>(newRank.size()) ? newRank[peer] : -1; };
  if (log_) log_->renumberPeers(newRank);
  std::vector<int> peers;
  for (int p : loggedPeers_)
    if (mapped(p) >= 0) peers.push_back(mapped(p));
  loggedPeers_ = std::move(peers);
  std::map<int, uint64_t> seqs;
  for (auto& [peer, seq] : logSeq_)
    if (mapped(peer) >= 0) seqs[mapped(peer)] = seq;
  logSeq_ = std::move(seqs);
  log::info("rank {}: boundary-send logs renumbered for the new view", rank_);
}

void Communicator::configureLog(const ecclLogConfig_t& c) {
  ECCL_CHECK_ARG(pendingLogs_.empty(), "ecclLogConfigure: {} logged send(s) are still in flight", pendingLogs_.size());
  ECCL_CHECK_ARG(c.whenFull >= ecclLogOnFullError && c.whenFull <= ecclLogOnFullEvict,
                 "ecclLogConfigure: invalid full policy {}", static_cast<int>(c.whenFull));
  ECCL_CHECK_ARG(c.numPeers >= 0 && (c.peers || c.numPeers == 0),
                 "ecclLogConfigure: peers is NULL with numPeers={} (NULL and 0 log every peer)", c.numPeers);
  std::vector<int> peers(c.peers, c.peers + c.numPeers);
  for (int p : peers) checkRank(p, "ecclLogConfigure peer");
  if (c.capacityBytes == 0) {
    log_.reset();
    loggedPeers_.clear();
    logAllPeers_ = false;
    return;
  }
  auto policy = c.whenFull == ecclLogOnFullBlock   ? log::FullPolicy::kBlock
                : c.whenFull == ecclLogOnFullEvict ? log::FullPolicy::kEvict
                                                   : log::FullPolicy::kError;
  try {
    log_ = std::make_unique<log::LogStore>(c.capacityBytes, policy);
  } catch (const std::bad_alloc&) {
    fail(ecclSystemError, "ecclLogConfigure: cannot allocate a log of {} bytes", c.capacityBytes);
  }
  loggedPeers_ = std::move(peers);
  logAllPeers_ = c.peers == nullptr;
  log::info("rank {}: logging sends to {} in {} bytes", rank_,
            logAllPeers_ ? std::string("every peer") : fmt::format("ranks {}", fmt::join(loggedPeers_, ",")),
            c.capacityBytes);
}

void Communicator::setLogTag(int64_t iteration, int32_t microbatch) { logTag_ = {iteration, microbatch}; }

size_t Communicator::truncateLog(int64_t iteration) {
  ECCL_CHECK_ARG(log_ != nullptr, "ecclLogTruncate: logging is not configured (ecclLogConfigure)");
  return log_->truncate(iteration);
}

void Communicator::fillLogStats(ecclLogStats_t* out) const {
  ecclLogStats_t s{};
  s.size = out->size;
  s.oldestIteration = s.newestIteration = -1;
  s.oldestMicrobatch = s.newestMicrobatch = -1;
  if (log_) {
    log::StoreStats st = log_->stats();
    s.records = st.records;
    s.bytes = st.bytes;
    s.capacityBytes = log_->capacity();
    if (st.oldest) s.oldestIteration = st.oldest->iteration, s.oldestMicrobatch = st.oldest->microbatch;
    if (st.newest) s.newestIteration = st.newest->iteration, s.newestMicrobatch = st.newest->microbatch;
    s.evictions = st.evictions;
    s.gaps = st.gaps;
  }
  std::memcpy(out, &s, std::min(out->size, sizeof(s)));
}

void Communicator::readLog(int peer, size_t index, ecclLogRecord_t* record, void* buffer, size_t bufferBytes) const {
  ECCL_CHECK_ARG(log_ != nullptr, "ecclLogRead: logging is not configured (ecclLogConfigure)");
  checkRank(peer, "ecclLogRead peer");
  const uint8_t* payload = nullptr;
  log::RecordInfo info = log_->read(peer, index, &payload);
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
    if (info.bytes) std::memcpy(buffer, payload, info.bytes);
  }
}

// Re-sends the records in order, each carrying its CRC32C so the receiver
// verifies it; posted together and waited in order. Replayed records are
// not logged again. The payloads are sent from the arena, so nothing on
// this communicator may send (and evict) or truncate meanwhile: like every
// call on a communicator, replay is not to be overlapped from another thread.
void Communicator::replayLog(int peer, int64_t fromIteration, int64_t toIteration) {
  checkUsable();
  checkRank(peer, "ecclLogReplay peer");
  ECCL_CHECK_ARG(log_ != nullptr, "ecclLogReplay: logging is not configured (ecclLogConfigure)");
  ECCL_CHECK_ARG(logsTo(peer), "ecclLogReplay: sends to rank {} are not logged (the configured peers are {})", peer,
                 logAllPeers_ ? std::string("all") : fmt::format("{}", fmt::join(loggedPeers_, ",")));
  ECCL_CHECK_ARG(peer != rank_, "ecclLogReplay: rank {} cannot replay to itself", peer);
  std::vector<const uint8_t*> payloads;
  std::vector<log::RecordInfo> records = log_->select(peer, fromIteration, toIteration, &payloads);
  std::vector<transport::RequestPtr> requests;
  for (size_t i = 0; i < records.size(); ++i) {
    uint64_t seq = transport::FrameHeader::kP2pBit | ++sendSeq_[peer];
    requests.push_back(
        device_->isend(view_.rankToMember[peer], seq, 0, payloads[i], records[i].bytes, &records[i].crc));
  }
  Deadline deadline = deadlineAfterMs(timeoutMs_);
  for (size_t i = 0; i < requests.size(); ++i)
    device_->wait(requests[i], deadline,
                  fmt::format("log replay to rank {} (record {} of {}: iteration {} micro-batch {}; rank {}, epoch {})",
                              peer, i + 1, requests.size(), records[i].tag.iteration, records[i].tag.microbatch, rank_,
                              view_.epoch));
  log::info("rank {}: replayed {} record(s) of iterations [{}, {}] to rank {}", rank_, records.size(), fromIteration,
            toIteration, peer);
}

}  // namespace eccl
