#include "transport/message_table.h"

#include <new>
#include <utility>

#include "common/copy.h"

namespace eccl::transport::lanes {

Inbox& MessageTable::openPosted(const InboxKey& key, RequestPtr request, uint8_t* buffer, size_t bytes, bool upTo) {
  Inbox& box = boxes_[key];
  box.request = std::move(request);
  box.userBuffer = buffer;
  box.total = bytes;
  box.capacity = bytes;
  box.upTo = upTo;
  return box;
}

MessageTable::iterator MessageTable::openUnexpected(const InboxKey& key, size_t total) {
  StagingBuffer staged = staging_.take(total);  // may throw: nothing is in the table yet
  auto [it, fresh] = boxes_.try_emplace(key);
  Inbox& box = it->second;
  box.unexpected = true;
  box.total = total;
  box.arrival = ++arrivals_;
  box.staged = std::move(staged);
  return it;
}

MessageTable::iterator MessageTable::openDiscarded(const InboxKey& key, size_t total) {
  auto [it, fresh] = boxes_.try_emplace(key);
  it->second.unexpected = true;
  it->second.cancelled = true;
  it->second.total = total;
  return it;
}

void MessageTable::deliverStaged(Inbox& box) {
  if (box.unexpected && box.total) copyBytes(box.userBuffer, box.staged.bytes.get(), box.total);
  staging_.give(box.staged);
}

StagingBuffer MessageTable::takeStaged(iterator it) {
  StagingBuffer staged = std::move(it->second.staged);
  boxes_.erase(it);
  return staged;
}

MessageTable::iterator MessageTable::erase(iterator it) {
  if (it->second.exposed == 0) staging_.give(it->second.staged);
  return boxes_.erase(it);
}

void MessageTable::erase(const InboxKey& key) {
  if (auto it = boxes_.find(key); it != boxes_.end()) erase(it);
}

MessageTable::iterator MessageTable::eraseDraining(iterator it, ecclResult_t code, std::string reason) {
  Inbox& box = it->second;
  draining_[it->first] = Draining{std::move(box.request), code, std::move(reason), std::move(box.staged), box.exposed};
  return boxes_.erase(it);
}

size_t MessageTable::unexpectedBytesHeld() const {
  size_t held = 0;
  for (const auto& [key, box] : boxes_)
    if (!box.request && !box.cancelled) held += box.staged.capacity;
  return held;
}

std::vector<RequestPtr> MessageTable::clear() {
  std::vector<RequestPtr> pending;
  for (auto& [key, box] : boxes_)
    if (box.request) pending.push_back(std::move(box.request));
  for (auto& [key, d] : draining_)
    if (d.request) pending.push_back(std::move(d.request));
  boxes_.clear();
  draining_.clear();
  return pending;
}

bool MessageTable::finishDrainingOne(const InboxKey& key, std::optional<Draining>* finished) {
  auto d = draining_.find(key);
  if (d == draining_.end()) return false;
  if (--d->second.exposed > 0) return true;
  staging_.give(d->second.staged);  // nothing writes into it any more
  *finished = std::move(d->second);
  draining_.erase(d);
  return true;
}

}  // namespace eccl::transport::lanes
