// eccl-run --etcd: the job's coordinators as replicated ecclcoord processes
// (ecclcoord serve --etcd) beside the launcher, instead of one inside it.
// The launcher starts them, takes the job's id from whichever leads first,
// follows the leader's status for its standby and chaos bookkeeping, and
// (--coord-chaos) kills the leader and starts a new replica at its address.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "membership/etcd_client.h"
#include "membership/unique_id.h"

namespace eccl::launcher {

struct ReplicaSet {
  std::string etcdEndpoints;
  std::string prefix;     // the job's keys in etcd
  std::string ecclcoord;  // the program
  std::string listenIp;   // every replica listens on this host's address (its own port)
  int replicas = 3;
  int ttlSeconds = 2;
};

class ReplicatedCoordinators {
 public:
  // Starts the replicas and waits for the job's id; throws naming why not.
  explicit ReplicatedCoordinators(ReplicaSet set);
  ~ReplicatedCoordinators();  // stops them in order and removes the job's keys

  const std::string& idText() const { return idText_; }
  // From the leader's last status (stale for a moment around a takeover).
  std::set<uint64_t> idleStandbyPids() const;
  std::set<uint64_t> viewPids() const;
  // Every one a leader has reported (a new leader knows only the
  // failures since it took over).
  std::set<uint64_t> fencedPids() const;
  // Kills the leading replica with SIGKILL and starts another at its
  // address; returns what it did, or an empty string when no replica of
  // ours leads right now.
  std::string killLeader();
  // The launcher reaps every child: a replica's exit comes here. False if
  // the pid is not a replica.
  bool exited(pid_t pid, int status);
  // Replicas that died without being killed on purpose.
  int failures() const { return failures_; }

 private:
  struct Replica {
    pid_t pid = -1;
    std::string listen;
    bool killed = false, running = true;
  };
  pid_t spawn(const std::string& listen);
  void pollStatus();

  ReplicaSet set_;
  std::string idFile_, dir_, idText_;
  membership::UniqueIdData id_;
  std::unique_ptr<membership::EtcdClient> etcd_;
  std::vector<Replica> replicas_;
  int failures_ = 0;
  mutable Mutex mu_;
  CondVar wake_;
  std::set<uint64_t> idle_ ECCL_GUARDED_BY(mu_), view_ ECCL_GUARDED_BY(mu_), fenced_ ECCL_GUARDED_BY(mu_);
  bool stopping_ ECCL_GUARDED_BY(mu_) = false;
  std::thread poller_;
};

}  // namespace eccl::launcher
