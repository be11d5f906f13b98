// Peer-memory snapshots of one communicator (docs/snapshots.md): named
// buffers copied into host memory and replicated to other ranks' memory in
// the background, versioned and sparse, restored into a replacement from
// the survivors' copies, persisted to a directory as a second level.
//
// A version commits when every rank's shards for it reached their replicas,
// which the ranks learn from each other (each rank's "replicated" notice
// travels once round the ring, with the names it put). The store keeps,
// per name, the latest committed copy and the copy of the version in
// progress; nothing is served that a committed catalog does not name.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "core/communicator.h"
#include "snapshot/gather.h"
#include "snapshot/store.h"

namespace eccl::snapshot {

struct Config {
  int replicas = 1;
  size_t maxInFlightBytes = 8 << 20;
};

class Snapshots {
 public:
  explicit Snapshots(Communicator& comm);
  // Its communicator's caller role (common/caller_role.h): what the
  // collective calls below require.
  CallerRole& callerRole() const ECCL_RETURN_CAPABILITY(comm_.callerRole()) { return comm_.callerRole(); }
  ~Snapshots();
  Snapshots(const Snapshots&) = delete;
  Snapshots& operator=(const Snapshots&) = delete;

  // Collective over the view for its members (they agree on the replica
  // count and learn each other's hosts); local for a member that came as a
  // standby, whose restore() does the same with the others.
  // `startingOver`: after a shrink, replacing this member's earlier
  // snapshots; always collective, even for a member that came as a standby.
  void configure(const Config& config, bool startingOver) ECCL_REQUIRES(callerRole());
  // Copies `bytes` into version `version`: `fill` writes them into the
  // snapshot's own buffer (one copy, from host or device memory).
  void put(int64_t version, const std::string& name, size_t bytes, const std::function<void(uint8_t*)>& fill);
  // This rank's puts for `version` are done: replication starts.
  void commit(int64_t version);
  // Until `version` (or a later one) committed, or it failed.
  void wait(int64_t version, int64_t timeoutMs);
  int64_t committed() const;
  // This rank's dense view: each name's latest committed copy.
  std::vector<std::pair<std::string, Entry>> list() const;
  // Hands this rank's committed copy of `name` (`bytes` long, checked) to
  // `read`; returns the version it comes from.
  int64_t get(const std::string& name, size_t bytes, const std::function<void(const uint8_t*)>& read) const ECCL_REQUIRES(callerRole());
  // The replicas this rank holds (owner: a rank of the snapshots' view,
  // which a view change leaves in place until restore or a new configure).
  struct Held {
    int owner;
    std::string name;
    Entry entry;
  };
  std::vector<Held> listHeld() const;
  int64_t getHeld(int owner, const std::string& name, size_t bytes,
                  const std::function<void(const uint8_t*)>& read) const;
  // A configure may start the snapshots over: the communicator's view is
  // smaller than the snapshots' (a recovery shrank it), or the last
  // ecclSnapshotRestore found shards in no memory or a view that shrank.
  bool mayStartOver() const ECCL_REQUIRES_SHARED(callerRole());
  // What the last restore() found (ecclSnapshotRestoreState).
  enum class RestoreVerdict { kOk, kShardsLost, kViewShrank };
  RestoreVerdict lastRestore() const;
  // ecclInvalidArgument unless `config` suits a view of `size` ranks.
  static void checkConfig(const Config& config, int size);
  // Collective over the current view after a view change: the ranks agree
  // on the newest committed version, a member that came as a standby gets
  // its rank's shards from the survivors, every rank fetches the replicas
  // it now holds, and replication resumes at the new epoch.
  int64_t restore() ECCL_REQUIRES(callerRole());
  // Second level (persist.cc). load(): on a new job's communicator, or
  // after a restore that lost shards (every rank drops what it holds).
  void persist(const std::string& directory);
  int64_t waitPersisted(int64_t timeoutMs);
  int64_t load(const std::string& directory) ECCL_REQUIRES(callerRole());

  // For tests: corrupts this rank's held copies of `owner`'s shards.
  void corruptHeldForTesting(int owner);
  // For benchmarks: this rank forgets its own copies, as a replacement
  // that has not restored yet (the next restore() fetches them).
  void forgetOwnForTesting();

 private:
  struct Need {  // a copy restore() must fetch
    int owner;
    std::string name;
    Entry entry;
  };
  int64_t redistribute(std::vector<CatalogDelta> catalog, int64_t newest, bool fresh) ECCL_REQUIRES(callerRole());
  std::vector<std::string> fetch(const std::vector<Need>& needs, const std::vector<RankInfo>& plan);
  void checkUsableLocked(const char* what) const ECCL_REQUIRES(mu_);
  void openLocked(int64_t version, const char* what) ECCL_REQUIRES(mu_);
  std::string pendingRanksLocked(int64_t version) const ECCL_REQUIRES(mu_);
  // Takes the view the ranks gathered in (replica counts must agree).
  void adoptView(const std::vector<RankInfo>& infos, const char* what) ECCL_REQUIRES(callerRole());
  void startEngine();
  void stopEngine();
  void engineMain();
  // Promotes what `version`'s catalog delta names, drops what it supersedes.
  void commitLocked(int64_t version) ECCL_REQUIRES(mu_);
  // `dropCopies`: the version can commit nowhere (a rank's shards missed a
  // holder), so its pending copies go; a view change alone keeps them for
  // restore(), since another rank may have committed it.
  void failVersionLocked(int64_t version, const std::string& why, bool dropCopies = true) ECCL_REQUIRES(mu_);
  std::vector<int> holdersOf(int owner) const;

  Communicator& comm_;
  const std::string hostKey_;
  const std::shared_ptr<BufferPool> pool_ = std::make_shared<BufferPool>();
  std::atomic<bool> stopping_{false};
  std::thread engine_;

  mutable Mutex mu_;
  mutable CondVar changed_;
  Config config_ ECCL_GUARDED_BY(mu_);
  bool configured_ ECCL_GUARDED_BY(mu_) = false;
  // What the engine runs against, fixed between restores.
  uint32_t epoch_ = 0;
  int rank_ = -1, size_ = 0;
  std::vector<transport::MemberId> members_;
  std::vector<std::string> hosts_;
  bool fresh_ ECCL_GUARDED_BY(mu_) = false;  // came as a standby and restored nothing yet
  // The last restore found shards in no memory: load() may replace what is
  // left with the persisted version (the second level's reason to exist).
  bool lostShards_ ECCL_GUARDED_BY(mu_) = false;
  bool startOverDue_ ECCL_GUARDED_BY(mu_) = false;  // a restore found the view shrank
  uint64_t generation_ = 0;  // restores so far, agreed by the ranks (Loop)

  Store store_ ECCL_GUARDED_BY(mu_);
  int64_t committed_ ECCL_GUARDED_BY(mu_) = -1;
  std::optional<int64_t> open_ ECCL_GUARDED_BY(mu_);         // puts allowed
  std::optional<int64_t> replicating_ ECCL_GUARDED_BY(mu_);  // handed to the engine
  std::map<int64_t, std::string> failed_ ECCL_GUARDED_BY(mu_);
  std::string brokenWhy_ ECCL_GUARDED_BY(mu_);  // the view changed: restore() first
  // Ring notices: per version, which ranks replicated and what they put.
  std::map<int64_t, std::map<int, CatalogDelta>> notices_ ECCL_GUARDED_BY(mu_);

  // Persist (persist.cc).
  std::thread persister_;
  int64_t persisted_ ECCL_GUARDED_BY(mu_) = -1;
  std::string persistError_ ECCL_GUARDED_BY(mu_);
  bool persisting_ ECCL_GUARDED_BY(mu_) = false;
};

}  // namespace eccl::snapshot
