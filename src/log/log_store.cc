#include "log/log_store.h"

#include <algorithm>

#include "common/error.h"

namespace eccl::log {

const size_t LogStore::kRecordOverheadBytes = sizeof(LogStore::Record);

LogStore::LogStore(size_t capacityBytes, FullPolicy policy) : arena_(capacityBytes), policy_(policy) {
  ECCL_CHECK_ARG(capacityBytes > 0, "log capacity must be positive");
}

bool LogStore::fitsLocked(size_t bytes, size_t* offset, size_t* footprint) const {
  const size_t cap = arena_.size();
  if (records_.empty()) {
    *offset = 0, *footprint = bytes;
    return bytes <= cap;
  }
  const size_t tail = records_.front().offset;
  const bool wrapped = head_ < tail || (head_ == tail && used_ > 0);
  if (!wrapped) {
    if (cap - head_ >= bytes) {
      *offset = head_, *footprint = bytes;
      return true;
    }
    if (tail >= bytes) {  // wrap: the unused end is held until this record goes
      *offset = 0, *footprint = bytes + (cap - head_);
      return true;
    }
    return false;
  }
  *offset = head_, *footprint = bytes;
  return tail - head_ >= bytes;
}

void LogStore::popOldestLocked(bool evicting) {
  Record& r = records_.front();
  used_ -= r.footprint;
  if (evicting && r.state == Record::State::kCommitted) {
    evictions_++;
    Tag& through = evictedThrough_[r.info.peer];
    through = std::max(through, r.info.tag);
  }
  records_.pop_front();
  if (records_.empty()) head_ = 0, used_ = 0;
}

LogStore::Reservation LogStore::reserve(const RecordInfo& info, Deadline deadline, const std::string& what) {
  MutexLock lock(mu_);
  if (info.bytes > arena_.size())
    fail(ecclLogFull, "{}: a record of {} bytes exceeds the log's capacity of {} bytes", what, info.bytes,
         arena_.size());
  size_t offset, footprint;
  while (!fitsLocked(info.bytes, &offset, &footprint)) {
    // The counts are arguments: the lambda runs under the lock, which the
    // thread-safety analysis cannot see through a closure.
    auto full = [&](const char* extra, size_t records, size_t used) {
      fail(ecclLogFull, "{}: the log is full ({} records, {} of {} bytes{}); truncate it (ecclLogTruncate) or "
           "configure a larger capacity or another policy", what, records, used, arena_.size(), extra);
    };
    switch (policy_) {
      case FullPolicy::kError:
        full("", records_.size(), used_);
        break;
      case FullPolicy::kEvict:
        if (records_.empty() || records_.front().state == Record::State::kPending)
          full("; the oldest record is still being sent", records_.size(), used_);
        popOldestLocked(true);
        break;
      case FullPolicy::kBlock:
        if (!freed_.waitUntil(mu_, deadline) && Clock::now() >= deadline)
          full(" after waiting for a truncate until the deadline", records_.size(), used_);
        break;
    }
  }
  Record r;
  r.info = info;
  r.offset = offset;
  r.footprint = footprint;
  r.id = nextId_++;
  head_ = offset + info.bytes;
  used_ += footprint;
  records_.push_back(r);
  return {r.id, arena_.data() + offset};
}

void LogStore::commit(const Reservation& res, uint32_t crc) {
  MutexLock lock(mu_);
  for (auto it = records_.rbegin(); it != records_.rend(); ++it)
    if (it->id == res.id) {
      it->info.crc = crc;
      it->state = Record::State::kCommitted;
      return;
    }
}

void LogStore::abandon(const Reservation& res) {
  MutexLock lock(mu_);
  for (auto it = records_.rbegin(); it != records_.rend(); ++it)
    if (it->id == res.id) {
      it->state = Record::State::kAbandoned;
      break;
    }
  reclaimAbandonedHeadLocked();
  freed_.notifyAll();
}

void LogStore::renumberPeers(const std::vector<int>& newRank) {
  MutexLock lock(mu_);
  auto mapped = [&](int peer) { return peer >= 0 && peer < static_cast<int>(newRank.size()) ? newRank[peer] : -1; };
  for (Record& r : records_) {
    if (r.state != Record::State::kCommitted) continue;
    r.info.peer = mapped(r.info.peer);
    if (r.info.peer < 0) r.state = Record::State::kAbandoned;
  }
  std::map<int, Tag> gaps;
  for (auto& [peer, tag] : evictedThrough_)
    if (mapped(peer) >= 0) gaps[mapped(peer)] = tag;
  evictedThrough_ = std::move(gaps);
}

size_t LogStore::truncate(int64_t iteration) {
  MutexLock lock(mu_);
  size_t freed = 0;
  while (!records_.empty()) {
    const Record& r = records_.front();
    if (r.state == Record::State::kPending) break;
    if (r.state == Record::State::kCommitted && r.info.tag.iteration >= iteration) break;
    popOldestLocked(false);
    ++freed;
  }
  truncatedBefore_ = std::max(truncatedBefore_, iteration);
  freed_.notifyAll();
  return freed;
}

// Abandoned records at the head of the log hold nothing anyone needs.
void LogStore::reclaimAbandonedHeadLocked() {
  while (!records_.empty() && records_.back().state == Record::State::kAbandoned) {
    used_ -= records_.back().footprint;
    head_ = records_.back().offset;
    records_.pop_back();
  }
  if (records_.empty()) head_ = 0, used_ = 0;
}

size_t LogStore::discardFrom(int64_t iteration) {
  MutexLock lock(mu_);
  size_t dropped = 0;
  for (Record& r : records_)
    if (r.state == Record::State::kCommitted && r.info.tag.iteration >= iteration) {
      r.state = Record::State::kAbandoned;
      ++dropped;
    }
  reclaimAbandonedHeadLocked();
  freed_.notifyAll();
  return dropped;
}

std::vector<RecordInfo> LogStore::select(int peer, int64_t from, int64_t to,
                                         std::vector<const uint8_t*>* payloads) const {
  ECCL_CHECK_ARG(from <= to, "log replay: fromIteration {} is after toIteration {}", from, to);
  MutexLock lock(mu_);
  if (from < truncatedBefore_)
    fail(ecclInvalidUsage, "log replay to rank {}: iterations before {} were truncated; the range starts at {}", peer,
         truncatedBefore_, from);
  auto gap = evictedThrough_.find(peer);
  if (gap != evictedThrough_.end() && gap->second.iteration >= from)
    fail(ecclInvalidUsage,
         "log replay to rank {}: the log has a gap: records up to iteration {} micro-batch {} were evicted (log full, "
         "evict policy); the range starts at {}",
         peer, gap->second.iteration, gap->second.microbatch, from);
  std::vector<RecordInfo> out;
  for (const Record& r : records_) {
    if (r.state != Record::State::kCommitted || r.info.peer != peer) continue;
    if (r.info.tag.iteration < from || r.info.tag.iteration > to) continue;
    out.push_back(r.info);
    if (payloads) payloads->push_back(arena_.data() + r.offset);
  }
  return out;
}

RecordInfo LogStore::read(int peer, size_t index, const uint8_t** payload) const {
  MutexLock lock(mu_);
  size_t seen = 0;
  for (const Record& r : records_) {
    if (r.state != Record::State::kCommitted || r.info.peer != peer) continue;
    if (seen++ == index) {
      if (payload) *payload = arena_.data() + r.offset;
      return r.info;
    }
  }
  fail(ecclInvalidArgument, "ecclLogRead: the log holds {} record(s) for rank {}, index {} is past them", seen, peer,
       index);
}

StoreStats LogStore::stats() const {
  MutexLock lock(mu_);
  StoreStats s;
  for (const Record& r : records_) {
    if (r.state != Record::State::kCommitted) continue;
    s.records++;
    s.bytes += r.info.bytes;
    if (!s.oldest || r.info.tag < *s.oldest) s.oldest = r.info.tag;
    if (!s.newest || r.info.tag > *s.newest) s.newest = r.info.tag;
  }
  s.evictions = evictions_;
  s.gaps = evictedThrough_.size();
  return s;
}

}  // namespace eccl::log
