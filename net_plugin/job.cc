#include "net_plugin/job.h"

#include <cstdlib>

#include "common/error.h"
#include "common/log.h"
#include "common/params.h"
#include "common/clock.h"
#include "membership/coord_client.h"
#include "membership/unique_id.h"

namespace eccl::netplugin {

namespace {

// eccl-run's variable, else the one torchrun and most launchers set.
int fromEnv(int ecclValue, const char* fallback) {
  if (ecclValue >= 0) return ecclValue;
  const char* v = std::getenv(fallback);
  if (!v || !*v) return -1;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  return *end == '\0' && n >= 0 && n < (1 << 30) ? static_cast<int>(n) : -1;
}

}  // namespace

std::unique_ptr<JobLink> JobLink::join(uint64_t self, const std::string& address, OnProcessFailed onFailed) {
  std::string idText = params::envUniqueId();
  if (idText.empty()) {
    log::info("net plugin: no eccl job (ECCL_UNIQUE_ID unset): failures are found by the transport alone");
    return nullptr;
  }
  int rank = fromEnv(params::envRank(), "RANK");
  int nranks = fromEnv(params::envNranks(), "WORLD_SIZE");
  if (rank < 0 || nranks <= 0 || rank >= nranks) {
    log::warn("net plugin: ECCL_UNIQUE_ID is set but this process's rank is not (ECCL_RANK/RANK={}, "
              "ECCL_NRANKS/WORLD_SIZE={}): not registered with the coordinator", rank, nranks);
    return nullptr;
  }
  std::unique_ptr<JobLink> link(new JobLink());
  try {
    membership::UniqueIdData id = membership::decodeUniqueId(membership::uniqueIdFromText(idText));
    membership::JoinRequest req{membership::Role::kRank, rank, nranks, self, address, false};
    req.failoverMs = params::coordFailoverMs();
    link->client_ = std::make_unique<membership::CoordClient>(id, req, params::heartbeatMs(),
                                                              params::heartbeatTimeoutMs(),
                                                              deadlineAfterMs(params::timeoutMs()));
  } catch (const std::exception& e) {
    log::warn("net plugin: not registered with the job's coordinator as rank {} of {}: {}", rank, nranks, e.what());
    return nullptr;
  }
  link->nranks_ = nranks;
  JobLink* raw = link.get();
  link->client_->setCallbacks({
      [onFailed](const membership::CoordMessage& f) {
        for (uint64_t m : f.members)
          if (onFailed) onFailed(m, f.text);
      },
      [](const std::string& why) { log::warn("net plugin: evicted from the job: {}", why); },
      nullptr,
      nullptr,
      [raw](const membership::CoordMessage& g) {
        MutexLock lock(raw->mu_);
        raw->broken_.emplace(g.uuid, g.text);
      },
  });
  log::info("net plugin: process {:016x} registered with the job's coordinator as rank {} of {}", self, rank, nranks);
  return link;
}

JobLink::~JobLink() = default;

void JobLink::watchGroup(uint64_t uuid) { client_->joinGroup(uuid); }
void JobLink::leaveGroup(uint64_t uuid) { client_->leaveGroup(uuid); }
void JobLink::leaveJob() { client_->leave(); }

bool JobLink::formed() {
  rankOf(0);  // takes any view that came
  MutexLock lock(mu_);
  return !ranks_.empty();
}

std::optional<int> JobLink::rankOf(uint64_t process) {
  MutexLock lock(mu_);
  // Views the coordinator sent since the last look (formation, recovery):
  // taken without waiting.
  for (;;) {
    try {
      membership::ViewUpdate v = client_->awaitView(Clock::now(), "the job's view");
      ranks_.clear();
      for (size_t r = 0; r < v.entries.size(); ++r) ranks_[v.entries[r].member] = static_cast<int>(r);
    } catch (const Error&) {
      break;  // none queued (or the coordinator is gone: the last view stands)
    }
  }
  auto it = ranks_.find(process);
  return it == ranks_.end() ? std::nullopt : std::optional<int>(it->second);
}

std::optional<std::string> JobLink::groupFailure(uint64_t uuid) {
  MutexLock lock(mu_);
  auto it = broken_.find(uuid);
  return it == broken_.end() ? std::nullopt : std::optional<std::string>(it->second);
}

}  // namespace eccl::netplugin
