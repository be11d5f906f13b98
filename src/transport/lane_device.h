// The device's internals, shared by its files: device.cc (the connection
// table: peers, dialing, accepting, lanes, view changes), device_io.cc
// (moving frames: posting, driving, reading and parsing), device_policy.cc
// (what failures, departures, disagreements and liveness probes do), and
// the rendezvous's device_zero_copy.cc and device_receive_ready.cc. The
// parts it owns are classes of their own: matching (message_table.h), and
// per lane bulk admission (bulk_admission.h) and the rendezvous
// (lane_rendezvous.h). Nothing outside src/transport includes this; see
// device.h.
#pragma once

#include "transport/device.h"

#include <fmt/ranges.h>
#include <sys/epoll.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <vector>
#include "membership/handshake.h"
#include "membership/handshake_gate.h"
#include "common/params.h"
#include "common/cpu_relax.h"
#include "common/crypto.h"
#include "common/error.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/netif.h"
#include "common/socket.h"
#include "transport/backend.h"
#include "transport/bulk_admission.h"
#include "transport/frame.h"
#include "transport/lane_rendezvous.h"
#include "transport/message_table.h"

namespace eccl::transport::lanes {


// Each thread that drives a wait has one eventfd, created on first use, by
// which other threads wake it when they complete its request.
class ThreadWakeFd {
 public:
  ~ThreadWakeFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() {
    if (fd_ < 0) fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    return fd_;
  }
  int peek() const { return fd_; }

 private:
  int fd_ = -1;
};
inline thread_local ThreadWakeFd t_wakeFd;
inline int threadWakeFd() { return t_wakeFd.peek(); }
inline thread_local bool t_progressThread = false;

constexpr size_t kReadBudgetPerEvent = 8 << 20;  // fairness between sockets
constexpr size_t kRxBufferBytes = 32 << 10;
constexpr size_t kDirectReadBytes = 8 << 10;  // payloads this large skip the receive buffer
constexpr uint64_t kWakeToken = 0;   // lane tokens start at 1
constexpr uint64_t kLanesToken = 1;  // in the progress thread's epoll only
// After a caller's wait the lanes stay with callers this long, so the next
// op's data does not wake the progress thread; it bounds how late an idle
// member answers a ping or notices a hang-up.
constexpr int64_t kLeaseMs = 2;
// Bulk frames (Device::isendBulk) one flush of a lane may start: 512 KiB.
constexpr size_t kBulkFramesPerFlush = 8;

struct Lane {
  ConnKey key;
  uint64_t token = 0;  // epoll cookie; 0 while unconnected
  // Shared with a read running without the device lock (readFramesLocked),
  // which keeps it alive if the lane closes meanwhile.
  std::shared_ptr<Conduit> conduit;
  // The conduit's slots for the fast path (Conduit::fastChannel), kept
  // after the lane closes: what the peer wrote before it left or failed
  // stays readable, as a whole message it sent before does here.
  std::shared_ptr<FastChannel> fast;
  bool wantOut = false;
  bool saidGoodbye = false;  // the peer's goodbye arrived on this lane
  bool opened = false;       // connected once (it may be closed again)
  // readLocked is parsing this lane, maybe with the device lock released
  // around a payload read: nobody else reads it, or arms it for sleep.
  bool reading = false;
  uint64_t readTicket = 0;  // which readLocked call set `reading` (LaneDevice::readTickets_)
  std::deque<SendItem> sendQueue;
  // Device::isendBulk's frames, none started: one moves to sendQueue when
  // that is empty and the lane has room for bulk.
  BulkAdmission bulk;
  // Receive state machine, touched only by the progress thread.
  enum class Rx { kHeader, kSignature, kPayload } rx = Rx::kHeader;
  uint8_t header[FrameHeader::kSize];
  size_t headerGot = 0;
  uint8_t signature[FrameHeader::kSignatureBytes];
  size_t signatureGot = 0;
  std::unique_ptr<uint8_t[]> rxBuffer;  // kRxBufferBytes, bytes [rxBegin, rxEnd) unparsed
  size_t rxBegin = 0, rxEnd = 0;
  FrameHeader frame;
  InboxKey inboxKey{};
  uint8_t* target = nullptr;
  bool discarding = false;  // read the payload and drop it (stale or rejected)
  size_t payloadGot = 0;
  std::vector<uint8_t> control;
  LaneRendezvous rendezvous;  // zero-copy chunks and announced receives
  bool hasSends() const { return !sendQueue.empty() || !bulk.empty() || !rendezvous.writes.empty(); }
  // Whether a send waits for room on the conduit (ring space or a send
  // slot); a zero-copy write under way waits for its completion instead,
  // which the armed conduit announces, so it must not keep anyone spinning.
  bool wantsRoom() const {
    return streamWantsRoom() || rendezvous.wantsSlot();
  }
  bool streamWantsRoom() const { return !sendQueue.empty() || bulk.wantsRoom(); }
};

struct Peer {
  enum class State { kIdle, kConnecting, kUp, kFailed, kLeft };
  MemberId id = 0;
  std::vector<std::pair<std::string, std::string>> address;  // each back end's part
  std::optional<bool> sharesHost;                             // sharesHostWith's answer, once asked
  std::string label;
  Device::PeerRole role = Device::PeerRole::kViewMember;
  State state = State::kIdle;
  ecclResult_t failCode = ecclSuccess;
  std::string failReason;
  std::vector<std::unique_ptr<Lane>> lanes;
  Backend* backend = nullptr;  // chosen by the lane that connects first
  std::optional<std::pair<uint64_t, Secret>> credentials;  // job id and secret to dial with
  uint32_t nextLane = 0;
  Clock::time_point lastPong{};  // the peer's progress thread answered a ping
  Clock::time_point pingSent{};  // checkAlive's ping, until a pong answers it
  bool leftReported = false;     // left in order, then an op needed it
  bool drainingLanes = false;    // readWhatFailedPeerSentLocked is reading its lanes
  uint64_t incarnation = 0;      // Device::peerIncarnation
  // Receives the peer announced (kReceiveReady), by epoch, op and tag.
  struct ReceiveReady {
    uint64_t address = 0;
    uint32_t key = 0;
    uint32_t length = 0;
    int writes = 0;       // our writes into it not completed yet
    bool closed = false;  // kReceiveDone came: forget it once writes is 0
    bool answer = false;  // and then answer kReceiveReleased (it was withdrawn)
  };
  std::map<std::tuple<uint32_t, uint64_t, uint32_t>, ReceiveReady> receiveReady;
};

class LaneDevice final : public Device {
 public:
  explicit LaneDevice(const DeviceOptions& o);
  ~LaneDevice() override;

  MemberId self() const override { return opt_.self; }
  std::string address() const override { return address_; }
  void addPeer(MemberId member, const std::string& address, const std::string& label, PeerRole role) override;
  LinksUp linksUp(MemberId member) const override {
    MutexLock lock(mu_);
    auto it = peers_.find(member);
    LinksUp up;
    if (it == peers_.end()) return up;
    for (auto& lane : it->second.lanes)
      if (lane->conduit) up.lanes++, up.queuePairs += lane->conduit->queuePairs();
    return up;
  }
  bool hasPeer(MemberId member) const override {
    MutexLock lock(mu_);
    auto it = peers_.find(member);
    return it != peers_.end() && it->second.state != Peer::State::kFailed && it->second.state != Peer::State::kLeft;
  }
  uint64_t peerIncarnation(MemberId member) const override {
    MutexLock lock(mu_);
    auto it = peers_.find(member);
    return it == peers_.end() ? 0 : it->second.incarnation;
  }
  void setEpoch(uint32_t epoch) override {
    MutexLock lock(mu_);
    eventLocked();
    if (epoch != epoch_) refusedOps_.clear(), calls_ = {};  // op numbers start over
    epoch_ = epoch;
  }
  void setLabel(const std::string& label) override {
    MutexLock lock(mu_);
    selfLabel_ = label;
  }
  RequestPtr isend(MemberId peer, uint64_t seq, uint32_t tag, const void* buf, size_t len,
                   const uint32_t* payloadCrc, const CallSignature* signature) override {
    return postSend(peer, seq, tag, buf, len, payloadCrc, signature, /*bulk=*/false);
  }
  RequestPtr isendBulk(MemberId peer, uint64_t seq, uint32_t tag, const void* buf, size_t len,
                       const uint32_t* payloadCrc) override {
    return postSend(peer, seq, tag, buf, len, payloadCrc, nullptr, /*bulk=*/true);
  }
  RequestPtr irecv(MemberId peer, uint64_t seq, uint32_t tag, void* buf, size_t len,
                   const CallSignature* signature) override {
    return postRecv(peer, seq, tag, buf, len, signature, /*upTo=*/false);
  }
  RequestPtr irecvUpTo(MemberId peer, uint64_t seq, uint32_t tag, void* buf, size_t capacity) override {
    return postRecv(peer, seq, tag, buf, capacity, nullptr, /*upTo=*/true);
  }
  void setPeerCredentials(MemberId member, uint64_t jobId, const Secret& secret) override {
    MutexLock lock(mu_);
    peerLocked(member).credentials = std::make_pair(jobId, secret);
  }
  void beginCall(uint64_t seq, const CallSignature& signature) override {
    MutexLock lock(mu_);
    checkLocalSignatureLocked(seq, signature);
  }
  void refuseCall(uint64_t seq, const std::string& reason) override {
    MutexLock lock(mu_);
    calls_.latest = std::max(calls_.latest, seq);
    calls_.running = false;
    calls_.failed.insert(seq);
    refusedLocked(seq, reason, std::nullopt);
  }
  std::optional<std::string> collectiveStarts(uint64_t seq, const CallSignature* signature,
                                              uint64_t endedWell) override;
  void collectiveEnds(uint64_t seq, bool ok) override;
  void collectiveEndsLocked(uint64_t seq, bool ok) ECCL_REQUIRES(mu_);
  void wait(const RequestPtr& request, Deadline deadline, const std::string& opName) override;
  bool test(const RequestPtr& request, const std::string& opName) override;
  void progress() override;
  void poll() override {
    MutexLock lock(mu_);
    serviceLanesAsGuestLocked();
  }
  void failPeer(MemberId member, ecclResult_t code, const std::string& reason, uint64_t neededFrom) override {
    MutexLock lock(mu_);
    // A notice can outrun the view that names the member (the coordinator
    // fails a rank while this process is still entering that view): it is
    // kept and applied when the member is added.
    if (!peers_.count(member)) failedBeforeKnown_[member] = {code, reason, neededFrom};
    // A verdict from outside the device is final, even on a candidate: a
    // view that names the member later must not give it a fresh start.
    judgedFailed_.insert(member);
    // What the member sent before it died is read first: a survivor that
    // reported another's failure and then exited often raced its own
    // notice, and the notice names the real culprit.
    readWhatFailedPeerSentLocked(member, /*mayWait=*/true);
    failPeerLocked(member, code, reason, /*flood=*/true, neededFrom);
  }
  bool checkAlive(MemberId member, int64_t silentMs) override;
  // The fast path's (device_fast.cc).
  std::shared_ptr<FastChannel> fastChannel(MemberId member, Deadline deadline) override;
  bool sharesHostWith(MemberId member) override;
  void foregroundBeside(MemberId member) override;
  std::vector<std::pair<MemberId, std::shared_ptr<FastChannel>>> fastChannels() override;
  uint64_t failureEvents() const override { return failureEvents_.load(std::memory_order_acquire); }
  std::optional<std::pair<ecclResult_t, std::string>> whyOpFails(MemberId member, uint64_t seq, bool commit) override;
  bool answersAtDeadline(MemberId member, uint64_t seq, bool sending) override;
  void callsDisagree(MemberId member, uint64_t seq, const CallSignature& mine, const CallSignature& theirs) override {
    MutexLock lock(mu_);
    callMismatchLocked(member, seq, mine, theirs);
  }
  void cancel(const RequestPtr& request, const std::string& reason) override;
  void cancelLocked(const RequestPtr& request, const std::string& reason) ECCL_REQUIRES(mu_);
  bool arrived(MemberId peer, uint64_t seq, uint32_t tag, size_t* bytes, uint64_t* order) override;
  void abort(const std::string& reason) override;
  void close(Deadline deadline) override;
  void removePeer(MemberId member) override;
  bool removePeerIncarnation(MemberId member, uint64_t incarnation) override;
  bool removePeerLocked(MemberId member, uint64_t incarnation) ECCL_REQUIRES(mu_);  // 0: any
  void beginEpoch(uint32_t epoch) override;
  void startConnect(MemberId member) override;
  void connectNow(MemberId member, Deadline deadline) override;
  DeviceStats stats() const override {
    MutexLock lock(mu_);
    DeviceStats s = stats_;
    s.unexpectedBytesHeld += messages_.unexpectedBytesHeld();
    for (auto& [token, lane] : lanesByToken_) {
      if (!lane) continue;
      s.openConnections++;
      s.openByBackEnd[lane->conduit->kind()]++;
    }
    for (const auto& backend : backends_) {
      BackendCounters c = backend->counters();
      s.queuePairsCreated += c.queuePairsCreated;
      s.queuePairsDestroyed += c.queuePairsDestroyed;
      s.completionQueuesOpen += c.completionQueuesOpen;
      s.registrationsReused += c.registrationsReused;
      s.singleCopyLanes += c.singleCopyLanes;
      s.singleCopyRefused += c.singleCopyRefused;
      s.singleCopyBytes += c.singleCopyBytes;
      s.peerReadLanes += c.peerReadLanes;
    }
    return s;
  }

 private:
  Peer& peerLocked(MemberId member) ECCL_REQUIRES(mu_);
  std::string labelLocked(MemberId member) ECCL_REQUIRES(mu_);
  void connectPeer(MemberId member) ECCL_EXCLUDES(mu_);
  void dialPeer(MemberId member, const std::vector<std::pair<std::string, std::string>>& address,
                const std::string& label, const std::pair<uint64_t, Secret>& credentials) ECCL_EXCLUDES(mu_);
  void installLaneLocked(Peer& peer, uint32_t lane, std::unique_ptr<Conduit> conduit) ECCL_REQUIRES(mu_);
  bool armLanesLocked() ECCL_REQUIRES(mu_);
  // Whether an RDMA transfer of ours is under way on some lane (a
  // rendezvous asked, a write posted, our memory exposed to the peer): its
  // completion is due within the transfer's time, so a waiting caller polls
  // for it (DeviceOptions::rdmaPollUs) rather than sleep.
  bool rdmaInFlightLocked() const ECCL_REQUIRES(mu_);
  void startBackends();
  Backend* backendFor(MemberId member, const std::vector<std::pair<std::string, std::string>>& address,
                      Deadline deadline, const std::string& what, const std::function<bool()>& giveUp, Fd* stream);
  void closeLaneLocked(Lane& lane) ECCL_REQUIRES(mu_);
  void flushLocked(Lane& lane) ECCL_REQUIRES(mu_);
  void flushLocked(Lane& lane, bool startWrite) ECCL_REQUIRES(mu_);
  bool writeQueuedLocked(Lane& lane) ECCL_REQUIRES(mu_);
  // Bulk admission's count (Lane::bulk): the receiving side's count and
  // report; the sender's answer to one.
  void bulkFrameReadLocked(Lane& lane) ECCL_REQUIRES(mu_);
  void onBulkReadLocked(Lane& lane) ECCL_REQUIRES(mu_);
  void setWantOutLocked(Lane& lane, bool on) ECCL_REQUIRES(mu_);
  void updateEpollLocked(Lane& lane, int op) ECCL_REQUIRES(mu_);
  void waitSliceLocked(const RequestPtr& r, Deadline until) ECCL_REQUIRES(mu_);
  bool driveLocked(const RequestPtr& r, Deadline until) ECCL_REQUIRES(mu_);
  void setCallerOwnedLocked(bool owned) ECCL_REQUIRES(mu_);
  void serviceLanesLocked(bool sockets = true) ECCL_REQUIRES(mu_);
  // Services lanes the progress thread owns (a poll, a ping's grace): what
  // this reads may use up the wake-up the sleeping progress thread armed
  // (a shared-memory writer rings once per arm), so the lanes are armed
  // again, or the thread woken to look. Without it a message that came
  // next waited out the thread's 200 ms timeout (a snapshot restore at 2
  // ranks: 42 -> 215 ms after collectives began to poll).
  void serviceLanesAsGuestLocked() ECCL_REQUIRES(mu_);
  void completeLocked(const RequestPtr& r, ecclResult_t code, std::string error) ECCL_REQUIRES(mu_);
  // fromSeq > 0: the member left in order and that collective was the first
  // to need it; those below it are unaffected (it finished its part of them
  // before it went), like revokeLocked's.
  void failPeerLocked(MemberId member, ecclResult_t code, const std::string& reason, bool flood, uint64_t fromSeq = 0,
                      FailureEvidence evidence = FailureEvidence::kObserved)
      ECCL_REQUIRES(mu_);
  void markLeftLocked(Peer& peer) ECCL_REQUIRES(mu_);
  void acceptLaneLocked(MemberId from, uint32_t lane, Backend* backend, std::unique_ptr<Conduit> conduit,
                        const std::string& what) ECCL_REQUIRES(mu_);
  void acceptOne(Backend& backend, membership::Admitted admitted);
  void installParkedLocked(MemberId member) ECCL_REQUIRES(mu_);
  void dropExpiredParkedLocked() ECCL_REQUIRES(mu_);
  // fromSeq: the first collective that needed it (0: a send or receive did).
  void leftPeerNeededLocked(Peer& peer, uint64_t fromSeq, const std::string& reason, bool flood) ECCL_REQUIRES(mu_);
  void floodNoticeLocked(MemberId member, const std::string& reason, uint64_t fromSeq) ECCL_REQUIRES(mu_);
  void discardOrphanedPayloadsLocked() ECCL_REQUIRES(mu_);
  // flush=false: the caller flushes later (a flood queues on every lane
  // first, so a write that fails one peer cannot get its own notice ahead
  // of the one being flooded).
  void queueControlLocked(Lane& lane, FrameType type, std::vector<uint8_t> payload, bool flush = true)
      ECCL_REQUIRES(mu_);
  // fromSeq > 0: collectives numbered below it are unaffected (every rank
  // has sent its part of them), so ranks still finishing one complete it.
  void revokeLocked(ecclResult_t code, const std::string& reason, uint64_t fromSeq = 0) ECCL_REQUIRES(mu_);
  // Fails every pending request whose op `dies` says (queued sends, ones
  // awaiting clearance or being written from pinned pages, receives).
  void failOpsLocked(const std::function<bool(uint64_t seq)>& dies, ecclResult_t code, const std::string& reason)
      ECCL_REQUIRES(mu_);
  // Collective `seq` was refused (here, or heard from the peer `from`):
  // its requests fail, later posts for it fail at once, the word goes on.
  void refusedLocked(uint64_t seq, const std::string& reason, std::optional<MemberId> from) ECCL_REQUIRES(mu_);
  // Queues one control frame to every connected member but `except`, then writes them.
  void floodControlLocked(FrameType type, std::vector<uint8_t> payload, std::optional<MemberId> except)
      ECCL_REQUIRES(mu_);
  const std::string* refusalOfLocked(uint64_t seq) const ECCL_REQUIRES(mu_);
  void dropRefusedMessagesLocked(uint64_t seq) ECCL_REQUIRES(mu_);
  // The refusal of op `seq` (`reason`) reached this member after its call
  // of that op returned success: the next call to start is refused naming
  // it.
  void refusedAfterSuccessLocked(uint64_t seq, const std::string& reason) ECCL_REQUIRES(mu_);
  bool revokesLocked(uint64_t seq) const ECCL_REQUIRES(mu_);
  void floodRevokeLocked(ecclResult_t code, const std::string& reason, uint64_t fromSeq) ECCL_REQUIRES(mu_);
  void checkLocalSignatureLocked(uint64_t seq, const CallSignature& mine) ECCL_REQUIRES(mu_);
  std::vector<uint8_t> goodbyePayloadLocked() const ECCL_REQUIRES(mu_);
  void checkGoodbyeSignaturesLocked(Lane& lane) ECCL_REQUIRES(mu_);
  void callMismatchLocked(MemberId peer, uint64_t seq, const CallSignature& mine, const CallSignature& theirs)
      ECCL_REQUIRES(mu_);
  bool pingLocked(MemberId member, uint64_t seq = 0) ECCL_REQUIRES(mu_);
  void answerPingLocked(Lane& lane) ECCL_REQUIRES(mu_);
  void onPongSignatureLocked(Lane& lane) ECCL_REQUIRES(mu_);

  void waitAny(const std::vector<RequestPtr>& requests, Deadline until) override;
  void notifyWaiters() override {
    MutexLock lock(mu_);
    cv_.notifyAll();
  }
  RequestPtr postSend(MemberId member, uint64_t seq, uint32_t tag, const void* buf, size_t len,
                      const uint32_t* payloadCrc, const CallSignature* signature, bool bulk);
  RequestPtr postRecv(MemberId peer, uint64_t seq, uint32_t tag, void* buf, size_t len,
                      const CallSignature* signature, bool upTo);
  // Whether the message a sender announced (`total` bytes) fits the posted receive.
  static bool fitsLocked(const Inbox& box, uint64_t total) {
    return box.upTo ? total <= box.capacity : total == box.total;
  }
  // Null: the lane is a fresh dial under a name the old lanes still hold.
  Peer* arrivedPeerLocked(MemberId member, uint32_t lane, uint64_t jobId, const std::string& from) ECCL_REQUIRES(mu_);
  Peer& newArrivedPeerLocked(MemberId member, uint64_t jobId, const std::string& from) ECCL_REQUIRES(mu_);
  void installRedialsLocked(MemberId id) ECCL_REQUIRES(mu_);
  void progressLoop();
  void acceptLoop();
  static RequestPtr newRequest(MemberId member, uint64_t seq, bool isSend);
  bool failIfPeerGoneLocked(const RequestPtr& r, Peer& p) ECCL_REQUIRES(mu_);
  // mayUnlock: the caller lets the device lock go around a large payload's
  // read (a pass over the lanes, whose callers hold no state across it).
  // Both return false when the lane closed or went away meanwhile: the
  // caller must not touch it again.
  bool readLocked(Lane& lane, bool mayUnlock = false, bool* drained = nullptr) ECCL_REQUIRES(mu_);
  bool readFramesLocked(Lane& lane, bool mayUnlock, bool* drained = nullptr) ECCL_REQUIRES(mu_);
  void readWhatFailedPeerSentLocked(MemberId member, bool mayWait) ECCL_REQUIRES(mu_);
  // The posted receive whose user buffer the lane's payload goes to, when
  // that may be read into without the lock; null otherwise.
  RequestPtr unlockedReadTargetLocked(const Lane& lane) ECCL_REQUIRES(mu_);
  ssize_t readUnlocked(Lane& lane, const RequestPtr& pinned, uint8_t* into, size_t n) ECCL_REQUIRES(mu_);
  // The oldest cleared zero-copy write of a lane whose conduit copies it
  // beside its other calls, with the lock released; false when the lane
  // closed or went away meanwhile (the caller must not touch it again).
  bool writeHeldZeroCopyLocked(Lane& lane) ECCL_REQUIRES(mu_);
  // The same where one is held back; false as above.
  bool writeHeldIfDueLocked(Lane& lane) ECCL_REQUIRES(mu_) {
    if (!lane.rendezvous.heldBack || lane.rendezvous.writing || !lane.conduit || !lane.conduit->writesZeroCopyBesideCalls())
      return true;
    return writeHeldZeroCopyLocked(lane);
  }
  // Runs `copy` (touching nothing the lock guards) with the lock released
  // and `pinned`'s completions held back meanwhile (completeLocked; given
  // at the unpin); errno as `copy` left it.
  template <class Copy>
  auto copyWithLockReleased(const RequestPtr& pinned, Copy&& copy) ECCL_REQUIRES(mu_) {
    pinLocked(pinned);
    mu_.unlock();
    auto result = copy();
    const int error = errno;
    mu_.lock();
    unpinLocked(pinned);
    errno = error;
    return result;
  }
  void pinLocked(const RequestPtr& r) ECCL_REQUIRES(mu_);
  void unpinLocked(const RequestPtr& r) ECCL_REQUIRES(mu_);
  // Where the cleared write began (the part of startZeroCopyWriteLocked
  // after the conduit took it): its ticket, the frame that follows it.
  void zeroCopyWriteStartedLocked(Lane& lane, SendItem& item, bool more) ECCL_REQUIRES(mu_);
  bool laneExistsLocked(const Lane* lane) const ECCL_REQUIRES(mu_) {
    for (auto& [id, peer] : peers_)
      for (auto& l : peer.lanes)
        if (l.get() == lane) return true;
    return false;
  }
  bool laneAliveLocked(const Lane* lane, uint64_t token) const ECCL_REQUIRES(mu_) {
    auto it = lanesByToken_.find(token);
    return token != 0 && it != lanesByToken_.end() && it->second == lane;
  }
  uint8_t* rxDestinationLocked(Lane& lane, size_t* want) ECCL_REQUIRES(mu_);
  bool advanceLocked(Lane& lane, size_t got) ECCL_REQUIRES(mu_);
  bool onHeaderLocked(Lane& lane) ECCL_REQUIRES(mu_);
  bool onSignatureLocked(Lane& lane) ECCL_REQUIRES(mu_);
  bool onDataFrameLocked(Lane& lane, const CallSignature* signature) ECCL_REQUIRES(mu_);
  bool placeDataFrameLocked(Lane& lane, const CallSignature* signature) ECCL_REQUIRES(mu_);
  void onPayloadDoneLocked(Lane& lane) ECCL_REQUIRES(mu_);
  bool checksumHoldsLocked(Inbox& box, const std::string& peerLabel) ECCL_REQUIRES(mu_);
  static std::string checksumFailure(size_t bytes, const std::string& peerLabel, uint32_t expected, uint32_t got);
  void deliverWholeStagedLocked(MessageTable::iterator it, const RequestPtr& r, std::string peerLabel)
      ECCL_REQUIRES(mu_);
  void onControlLocked(Lane& lane) ECCL_REQUIRES(mu_);
  // Zero-copy rendezvous (device_zero_copy.cc).
  void clearToSendLocked(Lane& lane) ECCL_REQUIRES(mu_);
  // Receiver-driven rendezvous (device_receive_ready.cc).
  void announceReceiveLocked(Peer& peer, const InboxKey& key, Inbox& box) ECCL_REQUIRES(mu_);
  void closeReceiveWindowLocked(const InboxKey& key, Inbox& box, bool withdrawn) ECCL_REQUIRES(mu_);
  bool onPrewrittenLocked(Lane& lane, const CallSignature* signature) ECCL_REQUIRES(mu_);
  bool takeReceiveReadyLocked(Lane& lane, SendItem& item) ECCL_REQUIRES(mu_);
  void countClearedWriteLocked(Lane& lane, SendItem& item) ECCL_REQUIRES(mu_);
  void onReceiveReadyLocked(Lane& lane) ECCL_REQUIRES(mu_);
  void onReceiveDoneLocked(Lane& lane) ECCL_REQUIRES(mu_);
  void onReceiveReleasedLocked(Lane& lane) ECCL_REQUIRES(mu_);
  void prewriteFinishedLocked(Lane& lane, const ChunkRef& chunk) ECCL_REQUIRES(mu_);
  void receiveWindowGoneLocked(const InboxKey& key) ECCL_REQUIRES(mu_);
  void onClearToSendLocked(Lane& lane) ECCL_REQUIRES(mu_);
  void onLandedLocked(Lane& lane) ECCL_REQUIRES(mu_);
  bool startZeroCopyWriteLocked(Lane& lane) ECCL_REQUIRES(mu_);
  void reapZeroCopyWritesLocked(Lane& lane) ECCL_REQUIRES(mu_);
  bool zeroCopyWriteFinishedLocked(const Lane& lane) const ECCL_REQUIRES(mu_);
  void chunkLandedLocked(const InboxKey& key, size_t bytes, bool arrived, const std::string& peerLabel)
      ECCL_REQUIRES(mu_);
  void messageArrivedLocked(MessageTable::iterator it, const std::string& peerLabel) ECCL_REQUIRES(mu_);
  // Fails a receive's message and forgets it; one the peer is still
  // writing into (zero-copy) fails once those writes landed or their lane
  // closed, so its memory is never written after its request failed.
  MessageTable::iterator dropBoxLocked(MessageTable::iterator it, ecclResult_t code, const std::string& reason)
      ECCL_REQUIRES(mu_);
  // Completes every send request queued on the lane with a failure.
  void failLaneSendsLocked(Lane& lane, ecclResult_t code, const std::string& reason) ECCL_REQUIRES(mu_);
  void finishChunkLocked(const RequestPtr& r) ECCL_REQUIRES(mu_) {
    if (r && --r->pendingChunks == 0) completeLocked(r, ecclSuccess, {});
  }
  void wakeLoop();
  // Something happened that may fail an op (failureEvents).
  void eventLocked() ECCL_REQUIRES(mu_) { failureEvents_.fetch_add(1, std::memory_order_release); }

  const DeviceOptions opt_;
  std::atomic<uint64_t> failureEvents_{0};
  // foregroundBeside's last turn (steady clock, ns): reads in place come
  // every 256 KiB, a turn is worth taking every kBesideEvery.
  std::atomic<int64_t> lastBesideNs_{0};
  // Back ends in the order a dial tries them.
  std::vector<std::unique_ptr<Backend>> backends_;
  std::string address_;
  // The progress thread sleeps on epollFd_, which holds the eventfd and
  // laneEpoll_; laneEpoll_ holds every connection. While callers drive the
  // lanes (and for a short lease after, so back-to-back ops keep them),
  // laneEpoll_ is silenced in epollFd_ and the progress thread stays asleep.
  Fd epollFd_;
  Fd laneEpoll_;
  Fd eventFd_;
  std::atomic<bool> stopping_{false};
  std::thread progressThread_;
  std::thread acceptThread_;
  struct Dial {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> finished;
  };

  mutable Mutex mu_{LockRank::kDevice};  // the outermost of the ranked mutexes (common/mutex.h)
  CondVar cv_;
  uint32_t epoch_ ECCL_GUARDED_BY(mu_) = 0;
  uint64_t incarnations_ ECCL_GUARDED_BY(mu_) = 0;  // Peer::incarnation's last
  bool aborted_ ECCL_GUARDED_BY(mu_) = false;
  bool closing_ ECCL_GUARDED_BY(mu_) = false;  // our goodbyes are out
  std::string abortReason_ ECCL_GUARDED_BY(mu_);
  // Set by the first peer failure: every pending and later op fails with
  // this reason, so all ranks report the member that actually failed.
  ecclResult_t revokedCode_ ECCL_GUARDED_BY(mu_) = ecclSuccess;
  std::string revokedReason_ ECCL_GUARDED_BY(mu_);
  uint64_t revokedFromSeq_ ECCL_GUARDED_BY(mu_) = 0;
  std::string selfLabel_ ECCL_GUARDED_BY(mu_) = "this rank";
  SignatureBook<MemberId> signatures_ ECCL_GUARDED_BY(mu_);
  uint64_t lastCheckedSeq_ ECCL_GUARDED_BY(mu_) = 0;  // the collective whose local signature is in the book
  std::map<uint64_t, std::string> refusedOps_ ECCL_GUARDED_BY(mu_);  // this epoch's refused collectives
  // This member's own collective calls this epoch, for refusals that
  // arrive after its part of the op completed (collectiveStarts).
  struct OwnCalls {
    uint64_t latest = 0;          // the highest op started here
    bool running = false;         // `latest` has not ended yet
    std::set<uint64_t> failed;    // ops whose call failed here: a refusal of one is no news
    std::optional<std::string> lateRefusal;  // heard after the op ended well, for the next call to carry
  };
  OwnCalls calls_ ECCL_GUARDED_BY(mu_);
  std::map<MemberId, Peer> peers_ ECCL_GUARDED_BY(mu_);
  struct EarlyFailure {
    ecclResult_t code;
    std::string reason;
    uint64_t neededFrom;
  };
  std::map<MemberId, EarlyFailure> failedBeforeKnown_ ECCL_GUARDED_BY(mu_);
  std::set<MemberId> candidateFailed_ ECCL_GUARDED_BY(mu_);  // failed while only a candidate
  std::set<MemberId> judgedFailed_ ECCL_GUARDED_BY(mu_);     // failed by failPeer: never a fresh start
  struct Parked {
    MemberId from;
    uint32_t lane;
    Backend* backend;
    std::unique_ptr<Conduit> conduit;
    Deadline deadline;
    std::string what;
    // Peers from connections: a fresh dial waiting for its name (inboundPeer
    // of `from`) to be let go of; the hello's job id and where it came from.
    bool redial = false;
    uint64_t jobId = 0;
    std::string address;
  };
  // Authenticated, from a member not known yet, or a fresh dial whose
  // name the old lanes still hold.
  std::vector<Parked> parked_ ECCL_GUARDED_BY(mu_);
  std::vector<Dial> dials_ ECCL_GUARDED_BY(mu_);  // one thread per member being dialed
  void joinFinishedDialsLocked() ECCL_REQUIRES(mu_);
  std::map<uint64_t, Lane*> lanesByToken_ ECCL_GUARDED_BY(mu_);
  std::vector<Lane*> memoryLanes_ ECCL_GUARDED_BY(mu_);  // lanes that pollsMemory()
  uint64_t nextToken_ ECCL_GUARDED_BY(mu_) = 1;
  MessageTable messages_ ECCL_GUARDED_BY(mu_);  // matching (transport/message_table.h)
  uint64_t readTickets_ ECCL_GUARDED_BY(mu_) = 0;
  int unlockedCopies_ ECCL_GUARDED_BY(mu_) = 0;  // copies running with mu_ released now
  int copyWaiters_ ECCL_GUARDED_BY(mu_) = 0;     // cancel calls waiting for one of them to end
  // A caller copying a large chunk asked the progress thread to copy the
  // peer's other lanes beside it (DeviceOptions::copyHelpBytes).
  bool helpWanted_ ECCL_GUARDED_BY(mu_) = false;
  bool callerOwned_ ECCL_GUARDED_BY(mu_) = false;
  // A request outside the background class completed since this pass over
  // the lanes began: its waiter needs the lock, so every lane still to be
  // read in the pass gets one read, not a whole budget (readFramesLocked).
  bool foregroundCompleted_ ECCL_GUARDED_BY(mu_) = false;
  int drivers_ ECCL_GUARDED_BY(mu_) = 0;
  std::atomic<int> driving_{0};  // drivers_, for the progress thread to look at without the lock
  Clock::time_point leaseUntil_ ECCL_GUARDED_BY(mu_){};
  DeviceStats stats_ ECCL_GUARDED_BY(mu_);
};

}  // namespace eccl::transport::lanes
