#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "transport/ibverbs/library.h"
#include "transport/ibverbs/verbs.h"

namespace eccl::transport::ibverbs {

RegistrationCache::~RegistrationCache() {
  for (auto& [start, e] : entries_) verbs().dereg_mr(e.mr);
}

ibv_mr* RegistrationCache::acquire(const void* address, size_t bytes) {
  ECCL_CHECK_ARG(address && bytes > 0, "registration of {} bytes at {}", bytes, address);
  const auto start = reinterpret_cast<uintptr_t>(address);
  // The registration starting at or before `start` is the only one that can
  // cover it with the least waste; ranges may overlap (a larger buffer
  // registered after a piece of it), so look a little further back too.
  auto it = entries_.upper_bound(start);
  for (int back = 0; back < 4 && it != entries_.begin(); ++back) {
    --it;
    Entry& e = it->second;
    uintptr_t end = it->first + e.mr->length;
    if (it->first <= start && start + bytes <= end) {
      if (e.holders++ == 0) idle_.erase(e.idle);
      stats_.hits++;
      return e.mr;
    }
  }
  ibv_mr* mr = verbs().reg_mr(context_.pd(), const_cast<void*>(address), bytes,
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  if (!mr && errno == ENOMEM) {  // pinned memory ran out: let go of what nobody holds, once
    size_t cap = cap_;
    cap_ = 0;
    evictIdle();
    cap_ = cap;
    mr = verbs().reg_mr(context_.pd(), const_cast<void*>(address), bytes,
                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  }
  if (!mr) fail(ecclSystemError, "{}: registering {} bytes at {}: {}", context_.name(), bytes, address, strerror(errno));
  if (auto old = entries_.find(start); old != entries_.end()) {
    // A shorter registration at the same address: the longer one replaces
    // it once nobody holds the old one (held ones stay valid meanwhile).
    if (old->second.holders > 0) {
      verbs().dereg_mr(mr);
      fail(ecclInternalError, "registration at {} is held with {} bytes; {} asked", address, old->second.mr->length,
           bytes);
    }
    idle_.erase(old->second.idle);
    stats_.bytes -= old->second.mr->length;
    verbs().dereg_mr(old->second.mr);
    entries_.erase(old);
  }
  entries_[start] = Entry{mr, 1, idle_.end()};
  stats_.registrations++;
  stats_.bytes += bytes;
  evictIdle();
  return mr;
}

void RegistrationCache::release(ibv_mr* mr) {
  auto it = entries_.find(reinterpret_cast<uintptr_t>(mr->addr));
  if (it == entries_.end() || it->second.mr != mr || it->second.holders == 0)
    fail(ecclInternalError, "release of a registration the cache does not hold ({} bytes at {})", mr->length, mr->addr);
  if (--it->second.holders == 0) {
    it->second.idle = idle_.insert(idle_.end(), it->first);
    evictIdle();
  }
}

void RegistrationCache::evictIdle() {
  while (stats_.bytes > cap_ && !idle_.empty()) {
    auto it = entries_.find(idle_.front());
    idle_.pop_front();
    stats_.bytes -= it->second.mr->length;
    verbs().dereg_mr(it->second.mr);
    entries_.erase(it);
    stats_.evictions++;
  }
}

RegistrationCache::Stats RegistrationCache::stats() const {
  Stats s = stats_;
  s.entries = entries_.size();
  return s;
}

}  // namespace eccl::transport::ibverbs
