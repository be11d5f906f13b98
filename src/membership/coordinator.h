// The membership coordinator: the only authority on views. It admits ranks
// and standbys (each proves the job secret), forms the first view, watches
// every member (its control connection and its heartbeats), declares
// failures and fences the failed, and computes each new view when the
// survivors ask to recover. It runs on its own thread inside eccl-run, the
// ecclcoord daemon, or the process that called ecclGetUniqueId; never
// inside a rank that eccl-run started.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "membership/unique_id.h"
#include "common/mutex.h"
#include "common/socket.h"

namespace eccl::membership {

// ecclRecoverPolicy_t values, repeated here so membership/ needs no core header.
enum class RecoverPolicy : uint32_t { kReplace = 0, kShrink = 1, kReplaceOrShrink = 2 };

// The coordinator's durable state in parts, each a key of its own in etcd
// (CoordinatorCore::exportState): a change rewrites the parts it touched,
// not the whole job. The set of keys is fixed, so a write never deletes.
using CoordinatorState = std::map<std::string, std::string>;

struct CoordinatorOptions {
  int64_t heartbeatMs = 500;
  int64_t heartbeatTimeoutMs = 3000;
  int64_t handshakeTimeoutMs = 5000;
  size_t maxUnauthenticated = 128;  // connections held before they prove the job secret
  // A REPLACE short of standbys is held this long, the idle ones reserved,
  // while more register (a launcher refilling its pool); 0 refuses at once.
  int64_t replaceWaitMs = 0;
  // How long a report that a member closed its lanes on the reporter waits
  // for the accused, still connected, to report the reporter first
  // (CoordinatorCore::heldReports). A killed member's own connection
  // closes at once and declares it without this wait.
  int64_t closedReportGraceMs = 1000;
  // A successor's start: the durable state of the coordinator it replaces
  // (CoordinatorCore::exportState); its members resume with it. Empty: a
  // new job.
  CoordinatorState takeOver;
  // Replication (membership/replica.h): called on the coordinator's thread
  // every round, with the durable state when it may have changed (before
  // the actions that announce the change go out) and null otherwise.
  // Returning false means this coordinator no longer leads: it stops at
  // once, carrying out nothing more, and closes every connection.
  std::function<bool(const CoordinatorState* state)> replicate;
};

class Coordinator {
 public:
  Coordinator(const UniqueIdData& id, Fd listenFd, const CoordinatorOptions& options);
  ~Coordinator();  // stops the thread; members see their connection close
  // Process ids of registered standbys not (yet) promoted into a view nor
  // reserved for a REPLACE that waits for more standbys.
  std::set<uint64_t> idleStandbyPids() const;
  // Process ids of the current view's members, failed ones included until
  // a new view replaces them. Both sets are snapshots, taken within 10 ms
  // of a membership change and at least every 100 ms.
  std::set<uint64_t> viewPids() const;
  // Process ids of the members declared failed (fenced) so far.
  std::set<uint64_t> fencedPids() const;
  // Whether it stopped on its own (it lost the lead, or failed).
  bool stopped() const { return stopped_; }
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

 private:
  struct State;
  void run();
  std::unique_ptr<State> state_;
  mutable Mutex snapshotMu_;
  std::set<uint64_t> idleStandbyPids_ ECCL_GUARDED_BY(snapshotMu_);
  std::set<uint64_t> viewPids_ ECCL_GUARDED_BY(snapshotMu_);
  std::set<uint64_t> fencedPids_ ECCL_GUARDED_BY(snapshotMu_);
  std::atomic<bool> stopping_{false};
  std::atomic<bool> stopped_{false};
  std::thread thread_;
};

// A fresh job: a new id (coordinator address, secret, job id) and its
// coordinator, listening on the chosen interface.
std::unique_ptr<Coordinator> createJob(ecclUniqueId* id);
// As createJob, with the coordinator kept on a thread of this process until
// it exits (ecclGetUniqueId).
ecclUniqueId createUniqueId();

// Options from the environment registry (ECCL_HEARTBEAT_MS, ...).
CoordinatorOptions coordinatorOptionsFromEnv();

// A status query from a tool (ecclcoord status): the view, standbys, health.
std::string queryCoordinatorStatus(const UniqueIdData& id, Deadline deadline);
// The process ids a status names: the view's members (failed ones too) and
// the standbys not reserved for a replacement, as Coordinator's
// viewPids()/idleStandbyPids() give them in process (a launcher whose
// coordinators run elsewhere reads them this way).
struct StatusPids {
  std::set<uint64_t> view, idleStandbys, fenced;
};
StatusPids parseStatusPids(const std::string& status);
// ecclcoord migrate: asks for an expected migration of `rank` to a standby;
// returns the coordinator's status once it is announced, throws its refusal.
std::string requestMigration(const UniqueIdData& id, int rank, Deadline deadline);
// A launcher: the process started as `rank` ended (`how`) before it
// registered. Before the job forms, an idle standby (or the next one to
// register) takes the rank; returns the coordinator's status, throws its
// refusal.
std::string reportRankExited(const UniqueIdData& id, int rank, const std::string& how, Deadline deadline);

}  // namespace eccl::membership
