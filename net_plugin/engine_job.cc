// The engine under an eccl job: the groups the preload shim watches, and
// the boundary-send log (sends to chosen job ranks, teed).
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "common/params.h"
#include "net_plugin/engine_state.h"

namespace eccl::netplugin {

std::optional<int> Engine::Impl::loggedRankLocked(uint64_t process, bool* wait) {
  *wait = false;
  if (!sendLog.store() || !job) return std::nullopt;
  std::optional<int> rank = job->rankOf(process);
  *wait = !rank && !job->formed();
  return rank && sendLog.logsTo(*rank) ? rank : std::nullopt;
}

void Engine::Impl::settleLocked(PluginRequest& request, bool ok) {
  if (!request.channel->sender || !sendLog.store()) return;
  sendLog.settle(request.parts[0] ? request.parts[0].get() : request.headers[0].get(), ok);
}

// ECCL_NET_LOG_BYTES, ECCL_NET_LOG_RANKS and ECCL_NET_LOG_WHEN_FULL, for a
// program that cannot call ecclNetLogConfigure. A bad setting is logged,
// never fatal to NCCL's init.
void Engine::configureLogFromEnv() {
  try {
    ecclLogConfig_t c{};
    c.size = sizeof(c);
    c.capacityBytes = static_cast<size_t>(params::netLogBytes());
    std::string policy = params::netLogWhenFull();
    if (policy == "block") c.whenFull = ecclLogOnFullBlock;
    else if (policy == "evict") c.whenFull = ecclLogOnFullEvict;
    else if (policy != "error")
      fail(ecclInvalidArgument, "ECCL_NET_LOG_WHEN_FULL='{}' must be error, block or evict", policy);
    std::vector<int> ranks;
    std::string list = params::netLogRanks();
    for (size_t at = 0; at < list.size();) {
      size_t end = std::min(list.find(',', at), list.size());
      std::string item = list.substr(at, end - at);
      char* stop = nullptr;
      long r = std::strtol(item.c_str(), &stop, 10);
      if (item.empty() || *stop != '\0' || r < 0 || r > INT32_MAX)
        fail(ecclInvalidArgument, "ECCL_NET_LOG_RANKS='{}': '{}' is not a rank", list, item);
      ranks.push_back(static_cast<int>(r));
      at = end + 1;
    }
    if (ranks.empty()) fail(ecclInvalidArgument, "ECCL_NET_LOG_BYTES is set but ECCL_NET_LOG_RANKS names no rank");
    c.peers = ranks.data();
    c.numPeers = static_cast<int>(ranks.size());
    logConfigure(c);
  } catch (const std::exception& e) {
    log::warn("net plugin: sends are not logged: {}", e.what());
  }
}

void Engine::logConfigure(const ecclLogConfig_t& config) {
  MutexLock lock(impl_->mu);
  if (!impl_->job)
    fail(ecclInvalidUsage, "the plugin's send log names job ranks: it needs an eccl job (ECCL_UNIQUE_ID and this "
                           "process's rank), and this process is not registered with one");
  impl_->sendLog.configure(config, impl_->job->nranks());
  impl_->logPolicy = config.whenFull;
}

void Engine::logSetTag(int64_t iteration, int32_t microbatch) {
  MutexLock lock(impl_->mu);
  impl_->sendLog.setTag(iteration, microbatch);
}

size_t Engine::logTruncate(int64_t iteration) {
  MutexLock lock(impl_->mu);
  return impl_->sendLog.truncate(iteration);
}

void Engine::logStats(ecclLogStats_t* out) {
  MutexLock lock(impl_->mu);
  impl_->sendLog.fillStats(out);
}

void Engine::logRead(int rank, size_t index, ecclLogRecord_t* record, void* buffer, size_t bufferBytes) {
  MutexLock lock(impl_->mu);
  impl_->sendLog.read(rank, index, record, buffer, bufferBytes);
}

bool Engine::watchGroup(uint64_t uuid) {
  if (!impl_->job) return false;
  impl_->job->watchGroup(uuid);
  return true;
}

void Engine::leaveGroup(uint64_t uuid) {
  if (impl_->job) impl_->job->leaveGroup(uuid);
}

std::optional<std::string> Engine::groupFailure(uint64_t uuid) {
  return impl_->job ? impl_->job->groupFailure(uuid) : std::nullopt;
}

}  // namespace eccl::netplugin
