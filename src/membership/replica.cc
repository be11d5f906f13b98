#include "membership/replica.h"

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "common/netif.h"
#include "common/params.h"
#include "membership/etcd_client.h"
#include "membership/etcd_leadership.h"

namespace eccl::membership {
namespace {

std::string candidateName() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return fmt::format("{}:{}", host, getpid());
}

SockAddr listenAddress(const std::string& listen) {
  if (listen.empty()) return pickInterface(params::socketIfname()).addr;
  const bool hasPort = listen.starts_with('[') ? listen.find("]:") != std::string::npos
                                               : listen.find(':') != std::string::npos;
  return SockAddr::parse(hasPort ? listen : listen + ":0");
}

// Holds the replica's address without accepting: while another replica
// leads, members' connects here are refused at once and they try the next.
std::pair<Fd, SockAddr> reserve(const SockAddr& address) {
  for (int attempt = 0;; ++attempt) {
    Fd fd(::socket(address.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd) fail(ecclSystemError, "coordinator replica: socket(): {}", strerror(errno));
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&address.storage), address.len) == 0) {
      SockAddr bound;
      bound.len = sizeof(bound.storage);
      getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound.storage), &bound.len);
      return {std::move(fd), bound};
    }
    // A restart may find its port held a moment longer by its predecessor.
    if (errno != EADDRINUSE || attempt >= 50)
      fail(ecclSystemError, "coordinator replica: cannot hold its address {}: {}", address.str(), strerror(errno));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

bool names(const UniqueIdData& id, const SockAddr& address) {
  for (const auto& a : id.coordinators())
    if (a.str() == address.str()) return true;
  return false;
}

std::string namedList(const UniqueIdData& id) {
  std::string out;
  for (const auto& a : id.coordinators()) out += (out.empty() ? "" : ", ") + a.str();
  return out;
}

// A replica the job's id does not name can never be reached by members.
[[noreturn]] void notNamed(const UniqueIdData& id, const SockAddr& mine) {
  fail(ecclInvalidUsage,
       "coordinator replica at {}: the job's id names its coordinators at {}, not this one, so members could never "
       "reach it; start every replica (ecclcoord serve --replicas N) before the job is made, or use a new "
       "--etcd-prefix",
       mine.str(), namedList(id));
}

std::optional<UniqueIdData> storedJob(EtcdClient& etcd, const std::string& prefix) {
  auto stored = etcd.get(prefix + "id");
  if (!stored) return std::nullopt;
  return decodeUniqueId(uniqueIdFromText(stored->value));
}

// The first leader names every replica registered by then, waiting (and
// renewing its lead) until `replicas` have or the wait runs out.
std::vector<SockAddr> registeredSpares(EtcdClient& etcd, EtcdLeadership& lead, const ReplicaOptions& options,
                                       const SockAddr& mine) {
  const auto until = Clock::now() + std::chrono::milliseconds(options.registerWaitMs);
  std::vector<EtcdKeyValue> registered;
  for (;;) {
    registered = etcd.getPrefix(options.prefix + "replicas/");
    if (static_cast<int>(registered.size()) >= options.replicas) break;
    if (Clock::now() >= until) {
      log::warn("coordinator replica: {} of {} replicas registered within {} ms; the job's id names those",
                registered.size(), options.replicas, options.registerWaitMs);
      break;
    }
    if (!lead.renew()) fail(ecclRemoteError, "lost the lead while the replicas registered: {}", lead.lastError());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::vector<SockAddr> spares;
  for (const auto& r : registered) {
    SockAddr a = SockAddr::parse(r.value);
    if (a.str() == mine.str()) continue;
    if (a.storage.ss_family != mine.storage.ss_family ||
        spares.size() >= maxSpareCoordinators(mine.storage.ss_family)) {
      log::warn("coordinator replica: the job's id cannot name the replica at {} (family or room)", a.str());
      continue;
    }
    spares.push_back(a);
  }
  return spares;
}

// The job this leader serves: the one in etcd, or a new one it records.
struct Job {
  UniqueIdData id;
  CoordinatorState state;  // empty: a new job
};

Job loadOrMakeJob(EtcdClient& etcd, EtcdLeadership& lead, const ReplicaOptions& options, const SockAddr& mine) {
  Job job;
  if (auto stored = storedJob(etcd, options.prefix)) {
    job.id = *stored;
    if (!names(job.id, mine)) notNamed(job.id, mine);
    // One range read: every part as of one revision (parts are only ever
    // written together, in one transaction).
    const std::string statePrefix = options.prefix + "state/";
    size_t bytes = 0;
    for (auto& kv : etcd.getPrefix(statePrefix)) {
      bytes += kv.value.size();
      job.state[kv.key.substr(statePrefix.size())] = std::move(kv.value);
    }
    log::info("coordinator replica: taking over the job at {} ({} parts, {} bytes of state)", mine.str(),
              job.state.size(), bytes);
    return job;
  }
  randomBytes(job.id.secret.data(), job.id.secret.size());
  randomBytes(&job.id.jobId, sizeof(job.id.jobId));
  job.id.root = mine;
  job.id.spares = registeredSpares(etcd, lead, options, mine);
  if (!lead.writeIfLeading({EtcdWrite::put(options.prefix + "id", uniqueIdToText(encodeUniqueId(job.id)))},
                           {EtcdCompare::absent(options.prefix + "id")}))
    fail(ecclRemoteError, "coordinator replica: lost the lead before recording the new job");
  log::info("coordinator replica: made a new job at {} (coordinators {})", mine.str(), namedList(job.id));
  return job;
}

// Registers this replica's address; etcd out of reach is waited out.
void registerReplica(EtcdClient& etcd, const ReplicaOptions& options, const std::string& name, const SockAddr& mine,
                     const std::atomic<bool>& stop) {
  while (!stop) {
    try {
      if (auto job = storedJob(etcd, options.prefix); job && !names(*job, mine)) notNamed(*job, mine);
      etcd.put(options.prefix + "replicas/" + name, mine.str());
      return;
    } catch (const Error& e) {
      if (e.code() == ecclInvalidUsage) throw;
      log::warn("coordinator replica: registering: {}", e.what());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace

void runReplica(const ReplicaOptions& options, const std::atomic<bool>& stop,
                const std::function<void(const std::string&)>& announce) {
  ECCL_CHECK_ARG(options.replicas >= 1, "a job needs at least one coordinator replica (got {})", options.replicas);
  EtcdClient etcd(options.etcdEndpoints, std::chrono::milliseconds(std::max<int64_t>(500, options.ttlSeconds * 300)));
  const std::string name = candidateName();
  EtcdLeadership lead(etcd, options.prefix, name, options.ttlSeconds);
  auto [reserved, mine] = reserve(listenAddress(options.listen));
  registerReplica(etcd, options, name, mine, stop);
  log::info("coordinator replica {}: at {}, campaigning", name, mine.str());
  const auto renewEvery = std::chrono::milliseconds(options.ttlSeconds * 1000 / 3);
  while (!stop) {
    bool leading = false;
    try {
      leading = lead.campaign();
    } catch (const Error& e) {
      log::warn("coordinator replica: campaigning: {}", e.what());
    }
    if (!leading) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      continue;
    }
    log::info("coordinator replica {}: leads", name);
    Job job;
    try {
      job = loadOrMakeJob(etcd, lead, options, mine);
    } catch (const Error& e) {
      lead.resign();
      if (e.code() == ecclInvalidUsage) throw;
      log::warn("coordinator replica: cannot take up the job: {}; campaigning again", e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      continue;
    }
    if (::listen(reserved.get(), 512) != 0)
      fail(ecclSystemError, "coordinator replica: listen({}): {}", mine.str(), strerror(errno));
    CoordinatorOptions opt = options.coordinator;
    opt.takeOver = job.state;
    auto lastRenew = Clock::now();
    // From here the coordinator's thread alone drives the leadership.
    // Each write puts only the parts that differ from what etcd holds.
    CoordinatorState stored = job.state;
    opt.replicate = [&](const CoordinatorState* state) {
      if (state) {
        std::vector<EtcdWrite> changed;
        std::vector<const std::pair<const std::string, std::string>*> differs;
        for (const auto& part : *state)
          if (auto it = stored.find(part.first); it == stored.end() || it->second != part.second) {
            changed.push_back(EtcdWrite::put(options.prefix + "state/" + part.first, part.second));
            differs.push_back(&part);
          }
        if (!changed.empty() && !lead.writeIfLeading(changed)) {
          log::warn("coordinator replica: the state write was refused ({}): no longer leading", lead.lastError());
          return false;
        }
        // Only what changed is copied: the whole state is 900 KB at 4,096 members.
        for (const auto* part : differs) stored[part->first] = part->second;
      }
      if (Clock::now() - lastRenew >= renewEvery) {
        lastRenew = Clock::now();
        if (!lead.renew()) {
          log::warn("coordinator replica: lost the lead: {}", lead.lastError());
          return false;
        }
      }
      return lead.leading();
    };
    auto coordinator = std::make_unique<Coordinator>(job.id, std::move(reserved), opt);
    announce(uniqueIdToText(encodeUniqueId(job.id)));
    while (!stop && !coordinator->stopped()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    coordinator.reset();  // closes the listener: members' connects are refused again
    // An orderly stop hands over at once; a coordinator that stopped on its
    // own could not write or renew, so another replica should lead.
    lead.resign();
    if (stop) break;
    reserved = reserve(mine).first;
  }
}

}  // namespace eccl::membership
