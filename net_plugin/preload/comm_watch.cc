#include "net_plugin/preload/comm_watch.h"

#include "common/log.h"

namespace eccl::preload {

namespace {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
constexpr uint64_t kFnvPrime = 0x100000001b3ull;

uint64_t fnv(uint64_t h, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * kFnvPrime;
  return h;
}

}  // namespace

uint64_t CommWatch::uuidOfIds(const void* ids, size_t bytes) { return fnv(kFnvOffset, ids, bytes); }

std::optional<uint64_t> CommWatch::childUuid(const void* parent, char kind, int color) {
  MutexLock lock(mu_);
  auto it = comms_.find(parent);
  if (it == comms_.end()) return std::nullopt;
  uint64_t h = fnv(kFnvOffset, &it->second.uuid, sizeof(uint64_t));
  h = fnv(h, &kind, 1);
  h = fnv(h, &it->second.children, sizeof(uint64_t));
  h = fnv(h, &color, sizeof(color));
  it->second.children++;
  return h;
}

void CommWatch::made(const void* comm, uint64_t uuid) {
  if (!comm) return;
  bool watched = source_.watch && source_.watch(uuid);
  MutexLock lock(mu_);
  Entry& e = comms_[comm];
  e = Entry{};
  e.uuid = uuid;
  e.watched = watched;
  log::info("eccl preload: communicator {} is group {:016x}{}", comm, uuid,
            watched ? ", watched by the job's coordinator" : " (no eccl job: not watched)");
}

void CommWatch::destroyed(const void* comm) {
  std::optional<uint64_t> watched;
  {
    MutexLock lock(mu_);
    auto it = comms_.find(comm);
    if (it == comms_.end()) return;
    if (it->second.watched) watched = it->second.uuid;
    comms_.erase(it);
  }
  if (watched && source_.leave) source_.leave(*watched);
}

std::optional<std::string> CommWatch::failure(const void* comm) {
  uint64_t uuid;
  {
    MutexLock lock(mu_);
    auto it = comms_.find(comm);
    if (it == comms_.end() || !it->second.watched) return std::nullopt;
    uuid = it->second.uuid;
  }
  std::optional<std::string> why = source_.failure ? source_.failure(uuid) : std::nullopt;
  if (!why) return std::nullopt;
  MutexLock lock(mu_);
  auto it = comms_.find(comm);
  if (it != comms_.end() && !it->second.reported) {
    it->second.reported = true;
    log::warn("eccl preload: communicator {} (group {:016x}) lost a member: {}", comm, uuid, *why);
  }
  return why;
}

int CommWatch::asyncError(const void* comm, int ncclAnswer) {
  if (ncclAnswer != kNcclSuccess && ncclAnswer != kNcclInProgress) return ncclAnswer;
  return failure(comm) ? kNcclRemoteError : ncclAnswer;
}

}  // namespace eccl::preload
