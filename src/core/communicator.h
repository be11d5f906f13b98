// The communicator: its view (epoch, rank -> member), its device (the
// connection table lives there, keyed by member), op sequence numbers and
// the revoked state. Collectives validate here and run src/coll algorithms.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/background.h"
#include "common/caller_role.h"
#include "common/function_ref.h"
#include "common/mutex.h"
#include "common/params.h"
#include "common/types.h"
#include "core/fast_path.h"
#include "core/sandbox_feed.h"
#include "eccl.h"
#include "elastic/migration.h"
#include "log/sender_log.h"
#include "membership/coord_client.h"
#include "transport/transport.h"

namespace eccl {

struct View {
  uint32_t epoch = 0;
  std::vector<transport::MemberId> rankToMember;
};

struct CommOptions {
  int64_t timeoutMs = 0;
  int socketsPerPeer = 0;
};

class Communicator {
 public:
  // A rank of the first view.
  Communicator(int nranks, const ecclUniqueId& id, int rank, const CommOptions& options);
  // A standby: registers, then (with `wait`) returns once promoted into a
  // view; without it, returns at once and awaitPromotion or reconfigure
  // takes it into a view later.
  Communicator(const ecclUniqueId& id, const CommOptions& options, int64_t promotionTimeoutMs, bool wait = true);
  ~Communicator();

  int rank() const ECCL_REQUIRES_SHARED(caller_) { return rank_; }
  transport::MemberId memberId() const { return self_; }
  bool isStandby() const ECCL_REQUIRES_SHARED(caller_) { return standby_; }
  int size() const ECCL_REQUIRES_SHARED(caller_) { return sandboxRanks_ > 0 ? sandboxRanks_ : static_cast<int>(view_.rankToMember.size()); }
  uint32_t epoch() const ECCL_REQUIRES_SHARED(caller_) { return view_.epoch; }
  // The epoch, safe to read from any thread (a background consumer's check
  // that the view it started in still holds).
  uint32_t currentEpoch() const { return currentEpoch_.load(); }
  transport::Device& device() { return *device_; }
  // The member at `rank` of the current view.
  transport::MemberId memberOf(int rank) const ECCL_REQUIRES_SHARED(caller_) { return view_.rankToMember.at(static_cast<size_t>(rank)); }
  int64_t timeoutMs() const { return timeoutMs_; }
  // The capability guarding the per-call state (common/caller_role.h):
  // api::Entered and the stream proxy hold it, and every method that
  // touches that state requires it.
  CallerRole& callerRole() const ECCL_RETURN_CAPABILITY(caller_) { return caller_; }
  // Registered as a standby (it took a rank later, if it has one now):
  // such a member brings no state of its own to the job.
  bool startedAsStandby() const { return startedAsStandby_; }

  // Blocking collectives; counts in elements. Throw eccl::Error.
  void allReduce(const void* in, void* out, size_t count, ecclDataType_t type, ecclRedOp_t op) ECCL_REQUIRES(caller_);
  void broadcast(const void* in, void* out, size_t count, ecclDataType_t type, int root) ECCL_REQUIRES(caller_);
  void reduce(const void* in, void* out, size_t count, ecclDataType_t type, ecclRedOp_t op, int root) ECCL_REQUIRES(caller_);
  void allGather(const void* in, void* out, size_t sendCount, ecclDataType_t type) ECCL_REQUIRES(caller_);
  void reduceScatter(const void* in, void* out, size_t recvCount, ecclDataType_t type, ecclRedOp_t op) ECCL_REQUIRES(caller_);
  void allToAll(const void* in, void* out, size_t count, ecclDataType_t type) ECCL_REQUIRES(caller_);
  void allToAllv(const void* in, const size_t* sendCounts, const size_t* sendDispls, void* out,
                 const size_t* recvCounts, const size_t* recvDispls, ecclDataType_t type) ECCL_REQUIRES(caller_);
  void barrier() ECCL_REQUIRES(caller_);

  // Point-to-point, split so a group can post everything before waiting.
  // A send to a logged peer is teed into the boundary-send log.
  transport::RequestPtr postSend(const void* buf, size_t bytes, int peer, ecclDataType_t type = ecclUint8) ECCL_REQUIRES(caller_);
  transport::RequestPtr postRecv(void* buf, size_t bytes, int peer, ecclDataType_t type = ecclUint8) ECCL_REQUIRES(caller_);
  void waitP2p(const transport::RequestPtr& request, int peer, bool isSend) ECCL_REQUIRES(caller_);
  // Non-blocking completion test of a posted send or receive; throws its failure.
  bool testP2p(const transport::RequestPtr& request, int peer, bool isSend) ECCL_REQUIRES(caller_);
  // The rank whose message, the one the next postRecv from it would take,
  // has begun to arrive (`peer`, or with peer < 0 any other rank's, the
  // first to arrive), and its size; -1 when none has.
  int probe(int peer, size_t* bytes) ECCL_REQUIRES(caller_);

  // This rank refuses the collective it was called for (its arguments
  // failed a check, `why`): the op still takes its number, and the other
  // ranks' parts of it fail naming this rank and why (the device passes
  // the word on), so none waits for data that never comes and every
  // rank's next call matches. Inside a group it runs where the op would.
  void refuseCollective(const std::string& why) ECCL_REQUIRES(caller_);
  // Throws the stored failure if the communicator is revoked.
  // Shared: what it reads, the proxy never changes.
  void checkUsable() const ECCL_REQUIRES_SHARED(caller_);
  ecclResult_t asyncError() const;
  // Why asyncError() is not ecclSuccess (empty when it is).
  std::string asyncErrorMessage() const;
  // An error of work the caller no longer waits for (a stream-ordered op):
  // reported by asyncError() and by the next call, like a peer failure.
  void recordAsyncError(ecclResult_t code, const std::string& message);
  void abort();
  void destroy() ECCL_REQUIRES(caller_);
  // After a revoke: agree on the next view with the coordinator and switch to it.
  void recover(ecclRecoverPolicy_t policy) ECCL_REQUIRES(caller_);
  void fillStats(ecclCommStats_t* out) const ECCL_REQUIRES(caller_);

  // Two-phase reconfiguration and grow (elastic::Migration decides;
  // core/switchover.cc applies).
  void prepareMigration(int rank) ECCL_REQUIRES(caller_);
  ecclPrepareState_t prepareStatus(std::string* why, int* leavingRank) const ECCL_REQUIRES(caller_);
  void switchover() ECCL_REQUIRES(caller_);
  void grow(int count) ECCL_REQUIRES(caller_);
  // Membership named outright (core/views.cc): the view becomes
  // `members` in that order, once every member named asks with the same
  // list and uuid; a standby calls it to be taken in.
  void reconfigure(const std::vector<transport::MemberId>& members, uint64_t uuid, int64_t timeoutMs) ECCL_REQUIRES(caller_);
  // A standby: waits until a view takes it in (recovery, grow, migration or
  // a named reconfiguration).
  void awaitPromotion(Deadline until) ECCL_REQUIRES(caller_);
  // A standby runs the application's step before it has a rank
  // (core/sandbox.cc): as rank `rank` of `nranks`, every collective and
  // send/receive completes here at once (what a one-rank group would
  // return where that is defined, zeros where data would come from
  // others), after the same argument checks; nothing touches the network.
  // nranks = 0 leaves it; a promotion ends it.
  void setSandbox(int nranks, int rank) ECCL_REQUIRES(caller_);
  bool sandboxed() const ECCL_REQUIRES_SHARED(caller_) { return sandboxRanks_ > 0; }
  // A rank records the signatures and outputs of its next `calls`
  // collectives and ships them, in the background, to the eager standbys
  // it knows, whose sandboxes answer the same calls with them
  // (core/sandbox_recording.h). 0 disarms.
  void recordSandboxCalls(int calls) ECCL_REQUIRES(caller_);
  // Ends this communicator for good from any thread, without freeing it:
  // blocked and later calls fail with `why`.
  void revoke(const std::string& why);
  void migrationSend(const void* buf, size_t bytes) ECCL_REQUIRES(caller_);
  void migrationRecv(void* buf, size_t bytes) ECCL_REQUIRES(caller_);

  // Boundary-send log (log::SenderLog; core/communicator_log.cc).
  void configureLog(const ecclLogConfig_t& config) ECCL_REQUIRES(caller_);
  void setLogTag(int64_t iteration, int32_t microbatch) ECCL_REQUIRES(caller_);
  size_t truncateLog(int64_t iteration) ECCL_REQUIRES(caller_);
  size_t discardLog(int64_t fromIteration) ECCL_REQUIRES(caller_);
  void fillLogStats(ecclLogStats_t* out) const ECCL_REQUIRES(caller_);
  void replayLog(int peer, int64_t fromIteration, int64_t toIteration) ECCL_REQUIRES(caller_);
  void readLog(int peer, size_t index, ecclLogRecord_t* record, void* buffer, size_t bufferBytes) const ECCL_REQUIRES(caller_);
  log::LogStore* logStoreForTesting() { return sendLog_.store(); }

  // Sends to self only make sense inside a group: they are matched in order.
  void pushSelfSend(const void* buf, size_t bytes) ECCL_REQUIRES(caller_);
  void popSelfRecv(void* buf, size_t bytes) ECCL_REQUIRES(caller_);

  void setLastError(std::string message);
  const char* lastError() const;

  // Validation shared with the API layer.
  void checkRank(int rank, const char* what) const ECCL_REQUIRES_SHARED(caller_);
  static void checkBuffer(const void* p, size_t count, const char* what);
  // Inline for the common case (every small call checks its size twice).
  static size_t checkedBytes(size_t count, ecclDataType_t type, size_t multiplier, const char* what) {
    // A count under 2^32 of one element: far under the limit.
    if (type >= 0 && type < ecclNumTypes && count < (size_t(1) << 32) && multiplier == 1) return count * typeSize(type);
    return checkedBytesOrFail(count, type, multiplier, what);
  }

 private:
  static size_t checkedBytesOrFail(size_t count, ecclDataType_t type, size_t multiplier, const char* what);
  class OpLinks;
  std::string opLabel(const char* name, uint64_t seq) const ECCL_REQUIRES(caller_);
  // Runs `body` under an OpLinks for the next collective sequence number;
  // every message of it carries `signature` (ECCL_CHECK_CALLS).
  // `out` (outBytes) is the call's output here, for a sandbox recording.
  // A collective's argument checks: an ecclInvalidArgument from them is
  // a refusal (refuseCollective), then thrown on.
  void refusing(FunctionRef<void()> checks) ECCL_REQUIRES(caller_);
  void runCollective(const char* name, const transport::CallSignature& signature,
                     FunctionRef<void(OpLinks&)> body, const void* out = nullptr, size_t outBytes = 0) ECCL_REQUIRES(caller_);
  void onPeerFailure(transport::MemberId member, ecclResult_t code, const std::string& reason, uint64_t neededFrom,
                     transport::FailureEvidence evidence);
  void onRevoked(ecclResult_t code, const std::string& reason);
  void join(const ecclUniqueId& id, membership::Role role, int rank, int nranks, const CommOptions& o) ECCL_REQUIRES(caller_);
  void applyView(const membership::ViewUpdate& v) ECCL_REQUIRES(caller_);
  void enterViewAtInit(const membership::ViewUpdate& v) ECCL_REQUIRES(caller_);
  // Reconfiguration news from the coordinator (client thread: must not block).
  void onReconfiguration(const membership::CoordMessage& m);
  void becomeJoiner(const membership::ViewUpdate& v) ECCL_REQUIRES(caller_);
  // A named reconfiguration left this member out: it drops its links and
  // is a standby of the job again (a later one may name it).
  void returnToStandby(const membership::ViewUpdate& v) ECCL_REQUIRES(caller_);
  void enterNextView(const membership::ViewUpdate& v, const std::vector<transport::MemberId>& leavers) ECCL_REQUIRES(caller_);
  // The leaver at a switchover: the others went on without it.
  void leaveView(const membership::ViewUpdate& v, Clock::time_point start) ECCL_REQUIRES(caller_);
  void finishReconfiguration(Clock::time_point start, Clock::time_point agreed, uint32_t oldEpoch, const char* what) ECCL_REQUIRES(caller_);

  struct Reconfiguration {
    uint64_t connectionsOpened = 0, connectionsClosed = 0, connectionsInherited = 0;
    double agreeMs = 0, applyMs = 0, totalMs = 0;
    uint64_t queuePairsOpened = 0, queuePairsClosed = 0;
    elastic::Migration::Prepared prepared;  // zero unless it was a prepared switchover
  };

  // First: the capability the members below are guarded by.
  mutable CallerRole caller_;
  int rank_ ECCL_GUARDED_BY(caller_) = -1;
  const int64_t timeoutMs_;
  // Tuning read once at init (the environment is not consulted per op).
  const size_t segmentBytes_ = static_cast<size_t>(params::ringSegmentBytes());
  const size_t smallAllreduceBytes_ = static_cast<size_t>(params::smallAllreduceBytes());
  const size_t directBytes_ = static_cast<size_t>(params::shmDirectBytes());
  // The view in which some rank said it may not read every peer's memory:
  // collectives stop asking until the view changes.
  std::optional<uint32_t> directRefusedEpoch_ ECCL_GUARDED_BY(caller_);
  std::map<transport::MemberId, bool> sharesHost_ ECCL_GUARDED_BY(caller_);
  std::pair<uint32_t, uint64_t> endedWell_ ECCL_GUARDED_BY(caller_){};  // (epoch, op)  // Device::sharesHostWith, asked once
  std::atomic<uint64_t> directCollectives_{0}, peerBytesRead_{0};  // for ecclCommGetStats from any thread
  const params::SmallAllreduce smallAllreduceAlgorithm_ = params::smallAllreduceAlgorithm();
  // Which latency algorithms open no connection beyond a view change's at
  // this view's size (the same answer on every rank), computed once a size.
  int latencyCheckedForSize_ ECCL_GUARDED_BY(caller_) = -1;
  bool doublingIsFree_ ECCL_GUARDED_BY(caller_) = false;
  bool everyPairConnected_ ECCL_GUARDED_BY(caller_) = false;
  void checkLatencyAlgorithms() ECCL_REQUIRES(caller_);
  params::SmallAllreduce smallAllreduceFor(size_t bytes) ECCL_REQUIRES(caller_);
  // Small broadcasts, reduces and allgathers by log-depth trees.
  bool latencyTree(size_t messageBytes) ECCL_REQUIRES(caller_);
  // Runs `algorithm` (a same-host one that reads the peers' buffers, false
  // when some rank may not) where the view and the size allow: true when
  // it moved the data.
  enum class DirectShape { kAllReduce, kBroadcast, kParts };  // kParts: all-gather, reduce-scatter
  size_t readsDirectlyFrom(DirectShape shape) const ECCL_REQUIRES(caller_);  // the smallest message read in place
  bool readDirectly(DirectShape shape, size_t messageBytes, FunctionRef<bool()> algorithm) ECCL_REQUIRES(caller_);
  bool everyRankOnThisHost() ECCL_REQUIRES(caller_);
  bool viewReadsEveryPeer(const std::vector<transport::MemberId>& members);
  // The last collective that returned success, not yet told to the device
  // (Device::collectiveStarts takes it), or 0.
  uint64_t takeEndedWell() ECCL_REQUIRES(caller_);
  const bool checkCalls_ = params::checkCalls();
  transport::MemberId self_ = 0;
  // A collective's small messages to peers on this host (core/fast_path.h).
  std::unique_ptr<FastPath> fast_ ECCL_GUARDED_BY(caller_);
  View view_ ECCL_GUARDED_BY(caller_);
  std::atomic<uint32_t> currentEpoch_{0};
  uint32_t joinedEpoch_ ECCL_GUARDED_BY(caller_) = 1;
  uint64_t reconfigurations_ ECCL_GUARDED_BY(caller_) = 0;
  Reconfiguration reconfig_ ECCL_GUARDED_BY(caller_);
  std::string lastWhy_ ECCL_GUARDED_BY(caller_);
  std::unique_ptr<transport::Device> device_;
  std::unique_ptr<membership::CoordClient> client_;
  Mutex reporterMu_{LockRank::kReporter};
  membership::CoordClient* reporter_ ECCL_GUARDED_BY(reporterMu_) = nullptr;
  bool eager_ = false;          // a standby keeping connections to the members open
  bool standby_ ECCL_GUARDED_BY(caller_) = false;        // registered as a standby and not yet in a view
  bool startedAsStandby_ = false;
  int sandboxRanks_ ECCL_GUARDED_BY(caller_) = 0;  // > 0: in the sandbox as rank_ of this many
  uint64_t sandboxOps_ ECCL_GUARDED_BY(caller_) = 0;
  // The sandbox's answers (core/sandbox.cc): `local` writes what a
  // one-rank group gives (zeros for others' data); a member's recorded
  // output of the same call replaces it.
  void sandboxCall(const transport::CallSignature& s, void* out, size_t outBytes, const std::function<void()>& local) ECCL_REQUIRES(caller_);
  // A send (out = nullptr) or receive: answered like a call, done at once.
  transport::RequestPtr sandboxPointToPoint(const transport::CallSignature& s, void* out, size_t bytes) ECCL_REQUIRES(caller_);
  void sandboxCopy(const void* in, void* out, size_t bytes) ECCL_REQUIRES(caller_);
  void sandboxZero(void* out, size_t bytes) ECCL_REQUIRES(caller_);
  void endSandbox() ECCL_REQUIRES(caller_);
  // Standby: an eager one takes in members' recordings while sandboxed.
  std::unique_ptr<sandbox::Feed> feed_;
  std::shared_ptr<const sandbox::Recording> replaying_ ECCL_GUARDED_BY(caller_);
  size_t replayCursor_ ECCL_GUARDED_BY(caller_) = 0;
  uint64_t sandboxReplayed_ ECCL_GUARDED_BY(caller_) = 0;
  // Member: the recording being made (the calling thread's, like collSeq_),
  // and, on the worker thread only, the eager standbys it ships to.
  void recordForSandbox(const transport::CallSignature& s, const void* out, size_t outBytes) ECCL_REQUIRES(caller_);
  void recordReceivePosted(const transport::CallSignature& s, const transport::RequestPtr& r, void* buf, size_t bytes) ECCL_REQUIRES(caller_);
  void recordReceiveDone(const transport::RequestPtr& r) ECCL_REQUIRES(caller_);
  void dropSandboxRecording(const char* why) ECCL_REQUIRES(caller_);
  void shipSandboxRecordingIfComplete() ECCL_REQUIRES(caller_);
  std::unique_ptr<sandbox::RecordingBuilder> recording_ ECCL_GUARDED_BY(caller_);
  std::vector<transport::MemberId> eagerStandbys_;
  std::map<transport::MemberId, uint64_t> recordingsSent_;
  std::atomic<uint64_t> recordingsShipped_{0};
  bool joining_ ECCL_GUARDED_BY(caller_) = false;        // a joiner before its switchover
  std::string leftView_ ECCL_GUARDED_BY(caller_);        // why this member is no longer in the view (migrated away)
  std::unique_ptr<BackgroundWorker> worker_;
  std::unique_ptr<elastic::Migration> migration_;
  uint64_t collSeq_ ECCL_GUARDED_BY(caller_) = 0;
  std::vector<uint64_t> sendSeq_ ECCL_GUARDED_BY(caller_), recvSeq_ ECCL_GUARDED_BY(caller_);

  log::SenderLog sendLog_;

  // Working memory of the algorithms (Links::scratch), kept across ops.
  uint8_t* scratch(int slot, size_t bytes) ECCL_REQUIRES(caller_);
  struct Scratch {
    std::unique_ptr<uint8_t[]> data;
    size_t bytes = 0;
  };
  std::vector<Scratch> scratch_ ECCL_GUARDED_BY(caller_);

  std::vector<std::pair<const void*, size_t>> selfSends_ ECCL_GUARDED_BY(caller_);
  size_t selfRecvIndex_ ECCL_GUARDED_BY(caller_) = 0;

  mutable Mutex errorMu_{LockRank::kCommError};
  std::string lastError_ ECCL_GUARDED_BY(errorMu_);
  // Written under errorMu_; atomic so that every call's check reads it
  // without the lock while it is ecclSuccess (asyncErrorWithoutLock).
  std::atomic<ecclResult_t> asyncError_ ECCL_GUARDED_BY(errorMu_){ecclSuccess};
  ecclResult_t asyncErrorWithoutLock() const ECCL_TSA(no_thread_safety_analysis) {
    return asyncError_.load(std::memory_order_acquire);
  }
  // The ranks disagreed about a call: nothing recovers this communicator.
  bool callMismatch_ ECCL_GUARDED_BY(errorMu_) = false;
  std::string asyncMessage_ ECCL_GUARDED_BY(errorMu_);
};

}  // namespace eccl
