// Two-phase reconfiguration, the state machine: an expected migration is
// prepared in the background (the next view's missing connections open
// while collectives keep running on the current one) and decided at a
// switchover every member calls at a collective boundary, by an in-band
// vote over links the preparation opened. The communicator owns one,
// feeds it the coordinator's announcements, and applies the view it
// decides; the migration never calls the communicator.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/background.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "eccl.h"
#include "membership/coord_client.h"
#include "transport/transport.h"

namespace eccl::elastic {

// What a migration works with, all of it below it.
struct MigrationLinks {
  transport::Device* device = nullptr;
  membership::CoordClient* client = nullptr;
  BackgroundWorker* worker = nullptr;  // runs the preparation off the client's thread
  int64_t timeoutMs = 0;
  // Tell the coordinator about a member this one lost while preparing, and
  // that this member is prepared (the communicator stops passing them on
  // once it left the view).
  std::function<void(transport::MemberId, const std::string&)> report;
  std::function<void(uint32_t epoch)> prepared;
  // Whether the collectives of a view of these members read every peer's
  // memory in place: they then need a lane to every member, which the
  // preparation opens instead of the first collective after the
  // switchover. Called on the worker; null: never.
  std::function<bool(const std::vector<transport::MemberId>&)> readsEveryPeer;
};

class Migration {
 public:
  explicit Migration(MigrationLinks links);

  // How messages name this member; set at every view change.
  void setRank(int rank) { rank_ = rank; }

  // The coordinator's PREPARE, PREPARE_READY and PREPARE_FAILED (the
  // client's thread: never blocks).
  void onAnnouncement(const membership::CoordMessage& m);
  // An eager standby and the members keep idle connections between them.
  void connectStandbys(const std::vector<membership::ViewEntry>& peers);

  // ecclCommPrepare, once the communicator has checked the rank: asks the
  // coordinator; asking again for the rank being prepared does nothing.
  void request(int rank);
  ecclPrepareState_t status(std::string* why, int* leavingRank) const;

  // The switchover's agreement: waits until every member of the next view
  // is prepared, then votes (`revoked`: this member votes no, saying why).
  // Throws when the switchover aborted; otherwise the next view is decided.
  // What the background preparation opened, for the statistics.
  struct Prepared {
    uint64_t connections = 0;  // lanes to the joiner (or, for it, to the others)
    uint64_t queuePairs = 0;   // queue pairs this process created meanwhile
    double ms = 0;             // announcement until this member was prepared
  };
  struct Decision {
    membership::ViewUpdate view;
    std::vector<transport::MemberId> leavers;
    bool leaving = false;  // this member is the leaver: it does not enter
    std::string missed;    // committed by others though this member's vote missed a member
    Clock::time_point agreed;
    Prepared prepared;
  };
  Decision decide(const std::string& revoked);
  // A member of the next view that will not vote (it recovers or leaves)
  // answers no at once, so nobody waits for it.
  void abstain();
  // The leaver tells its joiner it has finished its last op of the old view.
  void sendBoundaryToken();
  // A view was entered, recovered or superseded: nothing is being prepared.
  void reset();

  // The leaver-to-joiner channel (blocking, in order).
  void send(const void* buf, size_t bytes);
  void recv(void* buf, size_t bytes);

 private:
  // A view being prepared. Written by the client and worker threads.
  struct Preparation {
    ecclPrepareState_t state = ecclPrepareNone;
    uint32_t epoch = 0;  // the epoch it will become; 0 while only asked for
    std::vector<membership::ViewEntry> next;
    int leavingRank = -1;
    transport::MemberId joiner = 0;
    std::vector<transport::MemberId> leavers;
    std::string leaverAddress;
    bool locallyPrepared = false, everyonePrepared = false;
    bool tokenSent = false;  // the leaver told its joiner it is at its last boundary
    bool voted = false;      // this member's switchover vote is cast
    std::string why;
    Clock::time_point announced;
    Prepared prepared;
    // Lanes (and their queue pairs) up to each member of the delta when the
    // preparation was announced (an eager standby's are up already; they
    // are not the delta).
    std::vector<std::pair<transport::MemberId, transport::Device::LinksUp>> linksAtAnnounce;
  };

  void addPreparedPeersLocked() ECCL_REQUIRES(mu_);
  void prepareDelta(uint32_t nextEpoch);  // background job
  bool vote(const std::vector<membership::ViewEntry>& next, uint32_t nextEpoch, bool yes, std::string* why);
  membership::ViewUpdate awaitDecision();
  Deadline deadline() const { return deadlineAfterMs(links_.timeoutMs); }

  const MigrationLinks links_;
  const transport::MemberId self_;
  std::atomic<int> rank_{-1};
  mutable Mutex mu_;
  CondVar cv_;
  Preparation prep_ ECCL_GUARDED_BY(mu_);
  uint32_t settledEpoch_ ECCL_GUARDED_BY(mu_) = 0;  // the highest epoch whose preparation was entered or dropped
  uint64_t sendSeq_ = 0, recvSeq_ = 0;  // the leaver-to-joiner channel
};

}  // namespace eccl::elastic
