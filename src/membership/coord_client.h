// A member's side of the coordinator connection. It joins (as a rank or a
// standby), then a thread keeps heartbeats going both ways and delivers
// what the coordinator says: failures (revoke), eviction (fencing), and
// new views (formation, promotion, recovery).
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "membership/coord_messages.h"
#include "membership/unique_id.h"
#include "common/mutex.h"

namespace eccl::membership {

class SealedChannel;

struct ViewUpdate {
  uint32_t epoch = 0;
  int rank = -1;  // -1: still a standby, or no longer in the view
  std::vector<ViewEntry> entries;  // indexed by rank
  std::string why;
  // A standby chosen as the joiner of a migration being prepared: `epoch`
  // and `entries` are the next view, `leavers` the members it replaces.
  bool joining = false;
  std::vector<uint64_t> leavers;
  uint64_t uuid = 0;  // the named reconfiguration that made this view (0: another cause)
};

struct JoinRequest {
  Role role = Role::kRank;
  int rank = -1;
  int nranks = 0;
  uint64_t member = 0;
  std::string dataAddress;
  bool eager = false;  // standbys: keep data connections to the members open
  // When the coordinator is lost, how long to try the job's coordinator
  // address again for a successor that took over its state (a replicated
  // coordinator): the member resumes there with its id and rank, and
  // requests left unanswered are asked again. 0: a lost coordinator is final.
  int64_t failoverMs = 0;
};

class CoordClient {
 public:
  struct Callbacks {
    // Called on the client thread; must only record and wake, never block.
    // A kFailed: members (failed so far), neededFrom, text.
    std::function<void(const CoordMessage&)> onFailed;
    std::function<void(const std::string& reason)> onEvicted;
    // Reconfiguration news: prepare, prepare ready/failed, standby lists.
    std::function<void(const CoordMessage&)> onReconfiguration;
    // A standby hears of each new view (it is queued for awaitView too):
    // an eager one connects to the members at once, whether or not anyone
    // waits on it.
    std::function<void(const std::vector<ViewEntry>&)> onStandbyView;
    // A watched group (joinGroup) lost a member: uuid, members, text.
    std::function<void(const CoordMessage&)> onGroupFailed;
  };

  // Connects, proves the secret, sends the join; throws naming the coordinator.
  CoordClient(const UniqueIdData& id, const JoinRequest& join, int64_t heartbeatMs, int64_t heartbeatTimeoutMs,
              Deadline deadline);
  ~CoordClient();

  void setCallbacks(Callbacks callbacks);
  // The next view the coordinator sends (formation, promotion, recovery);
  // throws its error answer, eviction, or the deadline.
  ViewUpdate awaitView(Deadline deadline, const std::string& what);
  // neededFrom > 0: the member left in order and this member's collective
  // of that sequence number, in `epoch`, was the first to need it (0: it failed).
  // itClosedOnUs: what we saw was its end of our lanes closing (it may be
  // alive and have judged us failed; kReportPeerClosed).
  void report(uint64_t failedMember, const std::string& reason, uint64_t neededFrom = 0, uint32_t epoch = 0,
              bool itClosedOnUs = false);
  // Asks the coordinator to tell this member when another member that
  // joined the group `uuid` fails (onGroupFailed).
  void joinGroup(uint64_t uuid);
  // This member is done with the group (its communicator was destroyed):
  // its exit no longer breaks it for the others.
  void leaveGroup(uint64_t uuid);
  void requestRecover(uint32_t epoch, uint32_t policy);
  void requestGrow(uint32_t epoch, uint32_t count);
  void requestReconfigure(uint32_t epoch, uint64_t uuid, const std::vector<uint64_t>& members);
  void requestMigration(int rank);
  void prepared(uint32_t nextEpoch);
  void requestSwitchover(uint32_t nextEpoch);  // a leaver at its last boundary
  void reportSwitched(uint32_t nextEpoch, bool urgent);
  void reportSwitchFailed(uint32_t nextEpoch, const std::string& why);
  void leave();  // orderly exit: no failure is declared for us
  // Every wait for the coordinator, now and later, fails with `why`
  // (the communicator was revoked by its owner).
  void interrupt(const std::string& why);
  bool evicted() const;

 private:
  void run();
  void post(CoordMessage m, bool wake = true);
  void postGroup(uint64_t uuid, bool leave);
  void deliver(CoordMessage m);
  // Opens a channel to the coordinator and sends `join`; throws naming it.
  std::unique_ptr<SealedChannel> open(const CoordMessage& join, Deadline deadline, const std::string& what);
  // The first join: with replicated coordinators, one killed mid-handshake
  // is retried at its successor until the deadline (a wrong secret is not).
  std::unique_ptr<SealedChannel> openFirst(Deadline deadline, const std::string& what);
  // After a loss: resumes with a successor within join.failoverMs; false
  // (and why) when none took the member back.
  bool resume(std::string* why);

  const uint64_t self_;
  const UniqueIdData id_;
  CoordMessage join_;  // as first sent; a resume sends it again, marked
  const int64_t failoverMs_;
  std::unique_ptr<SealedChannel> channel_;
  // The last view the coordinator sent (its changes apply to it); the
  // client's thread only.
  HeldView held_;
  const std::string coordinator_;
  const int64_t heartbeatMs_, heartbeatTimeoutMs_;
  int wakeFd_ = -1;
  std::thread thread_;

  mutable Mutex mu_{LockRank::kCoordClient};
  CondVar cv_;
  bool stopping_ ECCL_GUARDED_BY(mu_) = false;
  std::deque<CoordMessage> outbox_ ECCL_GUARDED_BY(mu_);
  std::deque<CoordMessage> answers_ ECCL_GUARDED_BY(mu_);  // views and errors, in order
  std::optional<std::string> evicted_ ECCL_GUARDED_BY(mu_);
  std::optional<std::string> lost_ ECCL_GUARDED_BY(mu_);
  std::optional<std::string> interrupted_ ECCL_GUARDED_BY(mu_);
  Callbacks callbacks_ ECCL_GUARDED_BY(mu_);
  std::optional<CoordMessage> failedBeforeCallbacks_ ECCL_GUARDED_BY(mu_);
  std::vector<CoordMessage> reconfigBeforeCallbacks_ ECCL_GUARDED_BY(mu_);
  // Of the last view delivered, or of the view this member entered in band
  // (a unanimous switchover vote): what it tells a successor it is in.
  uint32_t epoch_ ECCL_GUARDED_BY(mu_) = 0;
  // The last request that waits for a view or an error (recover, grow,
  // reconfigure): asked again after a resume that brought no answer.
  std::optional<CoordMessage> unanswered_ ECCL_GUARDED_BY(mu_);
  // This member's last word in a migration (prepared, switchover, vote):
  // told again to a successor that may not have heard it, until a view of
  // that epoch or its abort comes. The coordinator takes it twice alike.
  std::optional<CoordMessage> reconfigSaid_ ECCL_GUARDED_BY(mu_);
  // The coordinator gave this member a rank or chose it to take one. Until
  // then a successor that lost its admission (the leader died before it
  // replicated it) may simply admit it again.
  bool placed_ ECCL_GUARDED_BY(mu_) = false;
};

}  // namespace eccl::membership
