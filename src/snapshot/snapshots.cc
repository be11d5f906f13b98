#include "snapshot/snapshots.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "common/copy.h"
#include "common/error.h"
#include "common/log.h"
#include "common/params.h"
#include "snapshot/gather.h"

namespace eccl::snapshot {
namespace {

// Ranks on one host share its fate: the host name and network namespace,
// unless ECCL_HOSTID names the failure domain (a launcher's simulated host).
std::string thisHost() {
  if (std::string id = params::hostId(); !id.empty()) return "id:" + id;
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  struct stat ns {};
  stat("/proc/self/ns/net", &ns);
  return fmt::format("{}/{}", name, static_cast<uint64_t>(ns.st_ino));
}

}  // namespace

Snapshots::Snapshots(Communicator& comm) : comm_(comm), hostKey_(thisHost()) {}

Snapshots::~Snapshots() {
  stopEngine();
  if (persister_.joinable()) persister_.join();
}

void Snapshots::startEngine() {
  stopping_ = false;
  if (size_ > 1) engine_ = std::thread([this] { engineMain(); });
}

void Snapshots::stopEngine() {
  stopping_ = true;
  if (engine_.joinable()) {
    comm_.device().notifyWaiters();
    engine_.join();
  }
}

void Snapshots::configure(const Config& config, bool startingOver) {
  if (comm_.isStandby()) fail(ecclInvalidUsage, "ecclSnapshotConfigure: this standby has no rank yet; call it once promoted");
  {
    MutexLock lock(mu_);
    if (configured_) fail(ecclInvalidUsage, "ecclSnapshotConfigure: snapshots are configured already (once per communicator)");
  }
  checkConfig(config, comm_.size());
  {
    MutexLock lock(mu_);
    config_ = config;
  }
  if (comm_.startedAsStandby() && !startingOver) {
    // A replacement: ecclSnapshotRestore, collective with the survivors,
    // is where it meets them. (Once it has snapshotted with them, a start
    // over after a shrink is theirs too: it gathers with them below.)
    MutexLock lock(mu_);
    fresh_ = true;
    configured_ = true;
    return;
  }
  std::vector<RankInfo> infos = gatherInfo(comm_, config.replicas, /*fresh=*/false, -1, 0, hostKey_);
  adoptView(infos, "ecclSnapshotConfigure");
  {
    MutexLock lock(mu_);
    configured_ = true;
    store_.catalog.assign(static_cast<size_t>(size_), {});
  }
  startEngine();
}

void Snapshots::checkConfig(const Config& config, int size) {
  if (config.replicas < 0 || config.replicas > std::max(0, size - 1))
    fail(ecclInvalidArgument, "ecclSnapshotConfigure: replicas={} must be in [0, {}] for {} ranks", config.replicas,
         std::max(0, size - 1), size);
  if (config.maxInFlightBytes == 0) fail(ecclInvalidArgument, "ecclSnapshotConfigure: maxInFlightBytes is 0");
}

bool Snapshots::mayStartOver() const {
  MutexLock lock(mu_);
  const bool viewShrank = configured_ && !fresh_ && comm_.currentEpoch() != epoch_ && comm_.size() < size_;
  return viewShrank || lostShards_ || startOverDue_;
}

Snapshots::RestoreVerdict Snapshots::lastRestore() const {
  MutexLock lock(mu_);
  return startOverDue_ ? RestoreVerdict::kViewShrank : lostShards_ ? RestoreVerdict::kShardsLost : RestoreVerdict::kOk;
}

void Snapshots::adoptView(const std::vector<RankInfo>& infos, const char* what) {
  int replicas;
  {
    MutexLock lock(mu_);
    replicas = config_.replicas;
  }
  for (size_t r = 0; r < infos.size(); ++r)
    if (infos[r].replicas != replicas)
      fail(ecclInvalidUsage, "{}: ranks disagree about the replica count: rank {} has {}, rank {} has {}", what,
           comm_.rank(), replicas, r, infos[r].replicas);
  rank_ = comm_.rank();
  size_ = comm_.size();
  epoch_ = comm_.epoch();
  members_.clear();
  hosts_.clear();
  for (int r = 0; r < size_; ++r) {
    members_.push_back(comm_.memberOf(r));
    hosts_.push_back(infos[static_cast<size_t>(r)].hostKey());
  }
}

std::vector<int> Snapshots::holdersOf(int owner) const {
  int replicas;
  {
    MutexLock lock(mu_);
    replicas = config_.replicas;
  }
  std::vector<int> chosen;
  std::set<std::string> usedHosts{hosts_[static_cast<size_t>(owner)]};
  // First ranks on hosts of their own, then (too few hosts) any rank.
  for (int pass = 0; pass < 2; ++pass)
    for (int step = 1; step < size_ && static_cast<int>(chosen.size()) < replicas; ++step) {
      int r = (owner + step) % size_;
      if (std::find(chosen.begin(), chosen.end(), r) != chosen.end()) continue;
      if (pass == 0 && usedHosts.count(hosts_[static_cast<size_t>(r)])) continue;
      chosen.push_back(r);
      usedHosts.insert(hosts_[static_cast<size_t>(r)]);
    }
  return chosen;
}

void Snapshots::checkUsableLocked(const char* what) const {
  if (!configured_) fail(ecclInvalidUsage, "{}: call ecclSnapshotConfigure first", what);
  if (fresh_) fail(ecclInvalidUsage, "{}: this replacement has not restored yet (ecclSnapshotRestore)", what);
  if (!brokenWhy_.empty()) fail(ecclInvalidUsage, "{}: {}", what, brokenWhy_);
  if (comm_.currentEpoch() != epoch_)
    fail(ecclInvalidUsage, "{}: the view changed (epoch {} -> {}); every member calls ecclSnapshotRestore first", what,
         epoch_, comm_.currentEpoch());
}

// A new version may begin once the one replicating is settled.
void Snapshots::openLocked(int64_t version, const char* what) {
  if (open_ && *open_ == version) return;
  if (open_) fail(ecclInvalidUsage, "{}: version {} is open; commit it before version {}", what, *open_, version);
  if (version <= committed_ || (replicating_ && version <= *replicating_) ||
      (!failed_.empty() && version <= failed_.rbegin()->first))
    fail(ecclInvalidUsage, "{}: version {} is not newer than the last one ({})", what, version,
         std::max({committed_, replicating_.value_or(-1), failed_.empty() ? -1 : failed_.rbegin()->first}));
  const Deadline until = deadlineAfterMs(comm_.timeoutMs());
  while (replicating_) {
    if (!brokenWhy_.empty()) fail(ecclInvalidUsage, "{}: {}", what, brokenWhy_);
    if (comm_.asyncError() != ecclSuccess)
      fail(ecclRemoteError, "{}: version {} cannot commit: {}", what, *replicating_, comm_.asyncErrorMessage());
    if (!changed_.waitUntil(mu_, std::min(until, Clock::now() + std::chrono::milliseconds(50))) &&
        Clock::now() >= until)
      fail(ecclTimeout, "{}: version {} is still replicating after {} ms ({})", what, *replicating_,
           comm_.timeoutMs(), pendingRanksLocked(*replicating_));
  }
  open_ = version;
}

std::string Snapshots::pendingRanksLocked(int64_t version) const {
  std::vector<int> missing;
  auto it = notices_.find(version);
  for (int r = 0; r < size_; ++r)
    if (it == notices_.end() || !it->second.count(r)) missing.push_back(r);
  return fmt::format("no notice yet from rank(s) {}", fmt::join(missing, ", "));
}

void Snapshots::put(int64_t version, const std::string& name, size_t bytes,
                    const std::function<void(uint8_t*)>& fill) {
  if (name.empty() || name.size() > kMaxNameBytes)
    fail(ecclInvalidArgument, "ecclSnapshotPut: a name has 1 to {} bytes ('{}' has {})", kMaxNameBytes, name,
         name.size());
  {
    MutexLock lock(mu_);
    checkUsableLocked("ecclSnapshotPut");
    openLocked(version, "ecclSnapshotPut");
  }
  Copy copy = makeCopy(version, bytes, pool_.get(), fill);  // outside the lock: it may be large
  MutexLock lock(mu_);
  if (!open_ || *open_ != version) fail(ecclInvalidUsage, "ecclSnapshotPut: version {} was committed meanwhile", version);
  store_.ownPending[name] = std::move(copy);
}

void Snapshots::commit(int64_t version) {
  {
    MutexLock lock(mu_);
    checkUsableLocked("ecclSnapshotCommit");
    openLocked(version, "ecclSnapshotCommit");
    open_.reset();
    replicating_ = version;
    if (size_ == 1) {  // nobody to replicate to
      notices_[version][0] = {};
      for (auto& [name, copy] : store_.ownPending) notices_[version][0][name] = copy.entry;
      commitLocked(version);
    }
  }
  comm_.device().notifyWaiters();
}

void Snapshots::wait(int64_t version, int64_t timeoutMs) {
  const Deadline until = deadlineAfterMs(timeoutMs > 0 ? timeoutMs : comm_.timeoutMs());
  MutexLock lock(mu_);
  for (;;) {
    if (committed_ >= version) return;
    auto failed = failed_.find(version);
    if (failed != failed_.end())
      fail(ecclRemoteError, "ecclSnapshotWait: version {} failed: {}", version, failed->second);
    if (!brokenWhy_.empty()) fail(ecclInvalidUsage, "ecclSnapshotWait: version {}: {}", version, brokenWhy_);
    // A revoked communicator (a rank failed) will not commit anything
    // until the view changes and the ranks restore.
    if (comm_.asyncError() != ecclSuccess)
      fail(ecclRemoteError, "ecclSnapshotWait: version {} cannot commit: {} ({})", version, comm_.asyncErrorMessage(),
           pendingRanksLocked(version));
    if (!changed_.waitUntil(mu_, std::min(until, Clock::now() + std::chrono::milliseconds(50))) &&
        Clock::now() >= until)
      fail(ecclTimeout, "ecclSnapshotWait: version {} is not committed after {} ms ({})", version,
           timeoutMs > 0 ? timeoutMs : comm_.timeoutMs(), pendingRanksLocked(version));
  }
}

int64_t Snapshots::committed() const {
  MutexLock lock(mu_);
  return committed_;
}

std::vector<std::pair<std::string, Entry>> Snapshots::list() const {
  MutexLock lock(mu_);
  std::vector<std::pair<std::string, Entry>> out;
  for (const auto& [name, copy] : store_.ownCommitted) out.emplace_back(name, copy.entry);
  return out;
}

int64_t Snapshots::get(const std::string& name, size_t bytes, const std::function<void(const uint8_t*)>& read) const {
  Copy copy;  // its bytes are immutable: checked and read outside the lock
  {
    MutexLock lock(mu_);
    auto it = store_.ownCommitted.find(name);
    if (it == store_.ownCommitted.end())
      fail(ecclInvalidArgument, "ecclSnapshotGet: rank {} has no committed copy of '{}'", comm_.rank(), name);
    copy = it->second;
  }
  if (copy.entry.bytes != bytes)
    fail(ecclInvalidArgument, "ecclSnapshotGet: '{}' holds {} bytes, the buffer {}", name, copy.entry.bytes, bytes);
  if (!copy.intact())
    fail(ecclSystemError, "ecclSnapshotGet: the host copy of '{}' (version {}) fails its checksum", name,
         copy.entry.version);
  if (bytes) read(copy.data->data());
  return copy.entry.version;
}

std::vector<Snapshots::Held> Snapshots::listHeld() const {
  MutexLock lock(mu_);
  std::vector<Held> out;
  for (const auto& [owner, copies] : store_.heldCommitted)
    for (const auto& [name, copy] : copies) out.push_back({owner, name, copy.entry});
  return out;
}

int64_t Snapshots::getHeld(int owner, const std::string& name, size_t bytes,
                           const std::function<void(const uint8_t*)>& read) const {
  Copy copy;  // immutable bytes: checked and read outside the lock
  {
    MutexLock lock(mu_);
    const Copy* found = nullptr;
    if (auto copies = store_.heldCommitted.find(owner); copies != store_.heldCommitted.end())
      if (auto it = copies->second.find(name); it != copies->second.end()) found = &it->second;
    if (!found)
      fail(ecclInvalidArgument, "ecclSnapshotGetHeld: rank {} holds no committed copy of rank {}'s '{}' (of {} ranks)",
           rank_, owner, name, size_);
    copy = *found;
  }
  if (copy.entry.bytes != bytes)
    fail(ecclInvalidArgument, "ecclSnapshotGetHeld: rank {}'s '{}' holds {} bytes, the buffer {}", owner, name,
         copy.entry.bytes, bytes);
  if (!copy.intact())
    fail(ecclSystemError, "ecclSnapshotGetHeld: the copy of rank {}'s '{}' (version {}) fails its checksum", owner,
         name, copy.entry.version);
  if (bytes) read(copy.data->data());
  return copy.entry.version;
}

void Snapshots::commitLocked(int64_t version) {
  if (version <= committed_) return;
  // The pool keeps about one version's bytes: what the next one reuses.
  size_t versionBytes = 0;
  for (const auto& [name, copy] : store_.ownPending) versionBytes += copy.entry.version == version ? copy.entry.bytes : 0;
  for (const auto& [owner, pending] : store_.heldPending)
    for (const auto& [key, copy] : pending) versionBytes += key.first == version ? copy.entry.bytes : 0;
  pool_->setCap(versionBytes);
  store_.promote(version, notices_[version], rank_);
  committed_ = version;
  std::erase_if(notices_, [&](const auto& kv) { return kv.first <= version; });
  if (replicating_ && *replicating_ <= version) replicating_.reset();
  changed_.notifyAll();
}

void Snapshots::failVersionLocked(int64_t version, const std::string& why, bool dropCopies) {
  if (version <= committed_ || failed_.count(version)) return;
  failed_[version] = why;
  if (dropCopies) {
    store_.dropPending(version, rank_);
    notices_.erase(version);
  }
  if (replicating_ && *replicating_ == version) replicating_.reset();
  if (open_ && *open_ == version) open_.reset();
  changed_.notifyAll();
}

void Snapshots::forgetOwnForTesting() {
  MutexLock lock(mu_);
  store_.ownCommitted.clear();
  fresh_ = true;
}

void Snapshots::corruptHeldForTesting(int owner) {
  MutexLock lock(mu_);
  for (auto& [name, copy] : store_.heldCommitted[owner]) {
    auto bytes = unpooledBuffer(copy.data->size());
    copyBytes(bytes->data(), copy.data->data(), copy.data->size());
    if (bytes->size()) bytes->data()[0] ^= 0xff;
    copy.data = std::move(bytes);
  }
}

}  // namespace eccl::snapshot
