#include "transport/ibverbs/verbs.h"

namespace eccl::transport::ibverbs {

SharedCompletions::SharedCompletions(Context& context, uint32_t capacity)
    : cq_(context, static_cast<int>(capacity)), capacity_(capacity) {}

bool SharedCompletions::reserve(uint32_t entries) {
  MutexLock lock(mu_);
  if (reserved_ + entries > capacity_) return false;
  reserved_ += entries;
  return true;
}

void SharedCompletions::unreserve(uint32_t entries) {
  MutexLock lock(mu_);
  reserved_ -= std::min(reserved_, entries);
}

void SharedCompletions::attach(uint32_t qpn, Sink* sink) {
  MutexLock lock(mu_);
  sinks_[qpn] = sink;
}

void SharedCompletions::detach(uint32_t qpn) {
  MutexLock lock(mu_);
  // Nothing more can come for a destroyed queue pair: what is in the queue
  // for it now is all there is, and must go before its number is reused.
  pollLocked();
  std::erase_if(undelivered_, [qpn](const ibv_wc& wc) { return wc.qp_num == qpn; });
  sinks_.erase(qpn);
}

void SharedCompletions::pollLocked() {
  ibv_wc wc[32];
  for (int n; (n = cq_.poll(wc, 32)) > 0;) undelivered_.insert(undelivered_.end(), wc, wc + n);
}

void SharedCompletions::drain() {
  MutexLock lock(mu_);
  pollLocked();
  size_t kept = 0;
  for (const ibv_wc& wc : undelivered_) {
    auto it = sinks_.find(wc.qp_num);
    if (it == sinks_.end())
      undelivered_[kept++] = wc;
    else
      it->second->onCompletion(wc);
  }
  undelivered_.resize(kept);
}

}  // namespace eccl::transport::ibverbs
