// The transport interface. Collectives and the core see only this; the back
// ends below it (backend.h) each live in their own folder.
//
// A Device is one endpoint of one communicator: it listens, keeps a table of
// connections keyed by (local member, remote member, lane), and moves
// messages addressed by (peer member, op sequence number, tag). Connections
// to a member are opened lazily on first use and can be added, replaced or
// closed one peer at a time without touching the others.
#pragma once

#include <atomic>
#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/crypto.h"
#include "eccl.h"
#include "transport/signature.h"

namespace eccl::transport {
class FastChannel;
}

namespace eccl::transport {

using MemberId = uint64_t;

struct ConnKey {
  MemberId local = 0;
  MemberId remote = 0;
  uint32_t lane = 0;
  auto operator<=>(const ConnKey&) const = default;
};

// What a peer's failure was concluded from. A peer that closed its lanes on
// us may be alive and have judged *us* failed (we stalled past its deadline
// and came back): the coordinator weighs that report against the peer's own
// before it believes it.
enum class FailureEvidence : uint8_t {
  kObserved,    // silence, a broken frame, a relayed notice: our own judgement
  kPeerClosed,  // the peer's end of a lane closed (end of file, reset, broken pipe)
};

// Completion handle of one posted send or receive. Its fields are written by
// the device under its lock; `state` may be read without it.
struct Request {
  enum State : int { kPending = 0, kDone = 1, kFailed = 2 };
  std::atomic<int> state{kPending};
  ecclResult_t code = ecclSuccess;
  std::string error;
  MemberId peer = 0;
  uint64_t seq = 0;
  bool isSend = false;
  size_t bytes = 0;  // a completed receive's length (irecvUpTo: what the sender sent)
  bool survivesRevocation = false;  // agreement traffic (FrameHeader::kAgreementBit)
  int pendingChunks = 0;
  // While a caller drives the I/O for this request itself, the eventfd
  // that wakes it when another thread completes the request; -1 otherwise.
  int driverWakeFd = -1;
  // Set by a layer above that completes this request itself (the fast
  // path, core/fast_path.h): its own index + 1; 0 for the device's.
  uint32_t fastIndex = 0;
  // The device's, under its lock: copies into this receive's buffer (or out
  // of this send's) running with the lock released (Conduit::readsBesideCalls,
  // writesZeroCopyBesideCalls). A completion that comes meanwhile is held
  // until the last of them returned, so a buffer is never touched after its
  // owner heard the request ended.
  int unlockedCopies = 0;
  std::optional<std::pair<ecclResult_t, std::string>> heldCompletion;
};
using RequestPtr = std::shared_ptr<Request>;

struct DeviceStats {
  uint64_t staleFramesDropped = 0;
  uint64_t refusedBytesDropped = 0;  // what peers sent for ops this member knows were refused
  uint64_t unexpectedBytesHeld = 0;  // staged now for messages nobody has asked for yet
  uint64_t framesRejected = 0;
  uint64_t connectionsRejected = 0;
  uint64_t connectionsOpened = 0;
  uint64_t connectionsClosed = 0;
  uint64_t bytesSent = 0;
  uint64_t bytesReceived = 0;
  // Of those, payload read straight into a posted receive with the device
  // lock released (Conduit::readsBesideCalls).
  uint64_t bytesReadUnlocked = 0;
  uint64_t bytesCopiedByHelper = 0;  // of those, by the progress thread a caller woke (copyHelpBytes)
  uint64_t zeroCopyBytesUnlocked = 0;  // zero-copy chunks written with the device lock released
  // Messages that came whole before their receive, copied out of staging
  // into it with the lock released (from DeviceOptions' 8 KiB).
  uint64_t stagedBytesCopiedUnlocked = 0;
  uint64_t openConnections = 0;  // lanes open now
  // Queue pairs of the lanes opened and closed (Conduit::queuePairs()), and
  // every back end's own count of those it created and destroyed (in-flight
  // handshakes and leaks included: what is really open).
  uint64_t queuePairsOpened = 0;
  uint64_t queuePairsClosed = 0;
  uint64_t queuePairsCreated = 0;
  uint64_t queuePairsDestroyed = 0;
  uint64_t completionQueuesOpen = 0;  // verbs: one serves many lanes
  uint64_t registrationsReused = 0;   // verbs, ECCL_IB_REGISTRATION_CACHE_BYTES: cache hits
  // Shared memory, ECCL_SHM_ZERO_COPY_BYTES: lanes whose sender may write
  // into the peer (process_vm_writev), lanes the kernel refused it (their
  // chunks go through the ring), and the bytes copied once that way.
  uint64_t singleCopyLanes = 0;
  uint64_t singleCopyRefused = 0;
  uint64_t singleCopyBytes = 0;
  // Shared memory: lanes whose peer's memory this process may read (same-host
  // collectives that read their peers' buffers in place use them).
  uint64_t peerReadLanes = 0;
  // Chunks moved by rendezvous straight between the users' buffers.
  uint64_t zeroCopyChunksSent = 0;
  uint64_t zeroCopyChunksReceived = 0;
  // Of those sent, the ones written into a receive the peer announced
  // before the data came (no clear-to-send asked).
  uint64_t zeroCopyChunksPrewritten = 0;
  // Posted receives announced to their senders (kReceiveReady), and such
  // announcements heard from peers.
  uint64_t receivesAnnounced = 0;
  uint64_t announcementsHeard = 0;
  std::map<std::string, uint64_t> openByBackEnd;  // the same, by back-end name
};

class Device {
 public:
  virtual ~Device() = default;

  virtual MemberId self() const = 0;
  // Where peers reach it: every back end's part (backend.h), one opaque string.
  virtual std::string address() const = 0;
  // How this member names itself in errors it sends its peers ("rank 0 (ip:port)").
  virtual void setLabel(const std::string& label) = 0;

  // Adds a member to the address book; `label` names it in error messages
  // ("rank 2 (10.0.0.3:4711)"). A candidate (a standby or a joiner being
  // prepared) is not in the view yet: its failure fails only its own ops and
  // never revokes the communicator. Adding a known peer again updates its
  // label and role and keeps its connections.
  enum class PeerRole { kViewMember, kCandidate };
  virtual void addPeer(MemberId member, const std::string& address, const std::string& label,
                       PeerRole role = PeerRole::kViewMember) = 0;
  // Dials `member` proving `secret` for job id `jobId` instead of the
  // device's own (a consumer addressed by handles: each carries its own
  // token). Set before the first post to it.
  virtual void setPeerCredentials(MemberId member, uint64_t jobId, const Secret& secret) = 0;
  virtual bool hasPeer(MemberId member) const = 0;
  // Which peer object answers to `member` now (0: none). A peer that
  // arrived anew under the same name (peers from connections: a process
  // dialed again) is a new incarnation, so a consumer acting on what it
  // knew of the old one can tell (removePeerIncarnation).
  virtual uint64_t peerIncarnation(MemberId member) const = 0;
  // Connections open to `member` now, and the queue pairs they own (verbs).
  struct LinksUp {
    uint32_t lanes = 0, queuePairs = 0;
  };
  virtual LinksUp linksUp(MemberId member) const = 0;
  uint32_t lanesUp(MemberId member) const { return linksUp(member).lanes; }
  // Frames stamped with an older epoch than this are dropped and counted.
  virtual void setEpoch(uint32_t epoch) = 0;

  // With `payloadCrc`, every frame carries the CRC32C of the whole message
  // and the receiver fails the receive if the data it got does not match.
  // With `signature`, the message carries the call it belongs to and is
  // checked against the receiver's (both ends must give one to be checked):
  // a disagreement revokes the communicator with ecclInvalidUsage from that
  // op on (earlier ops still complete), here and, by notices, everywhere.
  virtual RequestPtr isend(MemberId peer, uint64_t seq, uint32_t tag, const void* buf, size_t len,
                           const uint32_t* payloadCrc = nullptr, const CallSignature* signature = nullptr) = 0;
  // A send in the background class (snapshot replication): its frames,
  // at most kBulkFrameBytes each, go out on a lane only while nothing else
  // waits there and the lane holds little its peer has not read
  // (Conduit::roomForBulk), so a collective posted after it waits behind a
  // frame or two, never behind the whole message or a full ring. Received
  // like any message.
  static constexpr size_t kBulkFrameBytes = 64 << 10;
  virtual RequestPtr isendBulk(MemberId peer, uint64_t seq, uint32_t tag, const void* buf, size_t len,
                               const uint32_t* payloadCrc = nullptr) = 0;
  virtual RequestPtr irecv(MemberId peer, uint64_t seq, uint32_t tag, void* buf, size_t len,
                           const CallSignature* signature = nullptr) = 0;
  // A receive that takes any message of at most `capacity` bytes (NCCL's
  // net plugins: a receive may be larger than its send); request->bytes
  // says how many came. A larger message fails it like a size mismatch.
  virtual RequestPtr irecvUpTo(MemberId peer, uint64_t seq, uint32_t tag, void* buf, size_t capacity) = 0;
  // Whether message (seq, tag) from `peer` has begun to arrive with no
  // receive posted for it yet (MPI's probe): then its size in bytes and its
  // place in the order messages arrived here (smaller came first).
  virtual bool arrived(MemberId peer, uint64_t seq, uint32_t tag, size_t* bytes, uint64_t* order) = 0;
  // This member starts collective `seq` with `signature`, before posting
  // anything (an op may post nothing here, e.g. a count of 0): a peer's
  // frames for it are checked against it whenever they arrive.
  virtual void beginCall(uint64_t seq, const CallSignature& signature) = 0;
  // This member refused its part of collective `seq` (its arguments failed
  // a check) and will never run it: every member's part of that op fails
  // with `reason` (ecclInvalidUsage), here and at each peer the word
  // reaches (passed on peer to peer), now or when it gets there.
  virtual void refuseCall(uint64_t seq, const std::string& reason) = 0;
  // This member's call of collective `seq` starts, and ends (ok: it
  // returned success). A rank's part may complete (a root's sends) before
  // another rank's refusal of that op arrives; such a late refusal is
  // never lost: the next call to start here is refused in turn naming it
  // (collectiveStarts returns the refusal: the call fails with it, posting
  // nothing), so every rank hears of it by that call. With `signature`, a
  // call that starts also does beginCall's part, under the same lock (a
  // small op's cost is mostly per call).
  // `endedWell`: the collective before it that returned success here and
  // was not reported by collectiveEnds (0: none), one lock for both.
  virtual std::optional<std::string> collectiveStarts(uint64_t seq, const CallSignature* signature = nullptr,
                                                      uint64_t endedWell = 0) = 0;
  virtual void collectiveEnds(uint64_t seq, bool ok) = 0;
  // Blocks until the request completes. On failure or at the deadline throws
  // eccl::Error whose message starts with `opName` (unless it is empty) and
  // names the peer; a deadline declares that peer failed.
  virtual void wait(const RequestPtr& request, Deadline deadline, const std::string& opName) = 0;
  // Withdraws a pending request so the device never touches its buffer
  // again (a consumer closing a channel with requests in flight, NCCL's
  // abort): it fails with `reason`. A send partly written finishes from a
  // copy of the rest; a receive's message, whenever it comes, is discarded.
  virtual void cancel(const RequestPtr& request, const std::string& reason) = 0;
  // A background consumer's wait (snapshot replication): returns once one
  // of `requests` is no longer pending, at `until`, or when notifyWaiters()
  // or any device event wakes it, whichever is first. It never drives the
  // lanes (the callers' and the progress thread's job) and never judges a
  // peer at its deadline: the consumer decides what lateness means.
  virtual void waitAny(const std::vector<RequestPtr>& requests, Deadline until) = 0;
  virtual void notifyWaiters() = 0;
  // Non-blocking completion test; throws like wait() on failure.
  virtual bool test(const RequestPtr& request, const std::string& opName) = 0;
  // Moves whatever the connections are ready for, without blocking: a
  // caller with other work between posting and waiting (the log's copy of a
  // send) keeps its transfers going, since a caller that waited recently
  // holds the connections and no other thread drives them meanwhile.
  virtual void progress() = 0;
  // Services every lane now from the calling thread, whoever holds them: a
  // consumer that tests in a loop (NCCL's proxy thread) moves its own bytes
  // instead of waiting for the progress thread to be scheduled.
  virtual void poll() = 0;

  // A failure notice from outside the transport (or a local decision):
  // fails every pending op on that member and tells the other peers.
  // neededFrom > 0: the member left in order and the collective of that
  // sequence number was the first that needed it; earlier ops keep
  // receiving what it sent before its goodbye.
  virtual void failPeer(MemberId member, ecclResult_t code, const std::string& reason, uint64_t neededFrom = 0) = 0;
  // Fails every pending and later op; wakes every waiter.
  virtual void abort(const std::string& reason) = 0;
  // Orderly close: says goodbye on every connection, waits for queued
  // sends up to the deadline, then closes.
  virtual void close(Deadline deadline) = 0;

  // View changes. A leaver's connections close and it is forgotten; a new
  // epoch drops every op of older epochs and clears the revoked state, and
  // every other connection is inherited untouched.
  virtual void removePeer(MemberId member) = 0;
  // removePeer, only while `incarnation` still answers to the name; false
  // (nothing done) once a newer one does.
  virtual bool removePeerIncarnation(MemberId member, uint64_t incarnation) = 0;
  virtual void beginEpoch(uint32_t epoch) = 0;
  // Starts opening the connections to a member (the lower member id dials;
  // the other waits for it); returns at once where peers come from
  // connections (DeviceOptions), else once the dial is done. A post does the same.
  virtual void startConnect(MemberId member) = 0;
  // Waits until the connections to a member are open, starting them if
  // need be; throws at the deadline.
  virtual void connectNow(MemberId member, Deadline deadline) = 0;

  // Liveness for consumers that test rather than wait (the NCCL plugin),
  // called while they have requests on `member`: pings it once nothing has
  // answered for a quarter of `silentMs`, and declares it failed
  // (ecclTimeout: every request on it fails) when a ping stays unanswered
  // for three quarters. False once the member is failed or gone.
  virtual bool checkAlive(MemberId member, int64_t silentMs) = 0;

  virtual DeviceStats stats() const = 0;

  // What the fast path (core/fast_path.h) asks of the device: it moves a
  // collective's small messages through slots beside a lane
  // (fast_channel.h) without the device, and relies on the device for
  // everything else.
  // Whether `member` listens on this host for a back end that shares
  // memory (Backend::listensHere), found without opening a lane; the same
  // answer at both ends. Asked once per peer (kept until it is removed).
  virtual bool sharesHostWith(MemberId member) = 0;
  // A collective moves `member`'s data outside the lanes (reading its
  // memory in place): background traffic to it yields as it does to a
  // foreground message posted now.
  virtual void foregroundBeside(MemberId member) = 0;
  // The slots of `member`'s first lane, once its lanes are open (started
  // and waited for like a post's; throws at the deadline naming it); null
  // where that lane has none. Both ends of a lane see the same answer.
  virtual std::shared_ptr<FastChannel> fastChannel(MemberId member, Deadline deadline) = 0;
  // Every open lane's slots, by member: a waiter looks into all of them
  // now and then, so a message from a rank it does not exchange with in
  // this op (one that called something else) still has its call checked.
  virtual std::vector<std::pair<MemberId, std::shared_ptr<FastChannel>>> fastChannels() = 0;
  // Moves on every event that may fail an op (a peer failed or left, a
  // revocation, a refusal, an abort, a lane closed, a new epoch), so a
  // spinning waiter asks whyOpFails only when it moved.
  virtual uint64_t failureEvents() const = 0;
  // Why collective `seq`'s exchange with `member` cannot complete: what a
  // receive posted now would fail with. `commit`: and act on it as that
  // post would (a member that left in order and is needed revokes the
  // op); without it nothing changes.
  virtual std::optional<std::pair<ecclResult_t, std::string>> whyOpFails(MemberId member, uint64_t seq,
                                                                         bool commit) = 0;
  // A fast-path waiter's deadline passed: pings the member; true when it
  // answered (a live peer blocked on someone else: wait once more), else it
  // is declared failed (ecclTimeout, as a wait's deadline does) and false.
  virtual bool answersAtDeadline(MemberId member, uint64_t seq, bool sending) = 0;
  // A message that came by the fast path carries a call that disagrees
  // with this member's: revokes as a frame's signature would.
  virtual void callsDisagree(MemberId member, uint64_t seq, const CallSignature& mine,
                             const CallSignature& theirs) = 0;

  // Called when a peer is declared failed, on whichever thread saw it and
  // with the device lock held: it must only record, never call the device.
  // Set before the first post. neededFrom as for failPeer (0: a failure).
  std::function<void(MemberId, ecclResult_t, const std::string&, uint64_t neededFrom, FailureEvidence)>
      onPeerFailure;
  // Called, like onPeerFailure, when the communicator is revoked without a
  // member failing (the ranks disagreed about a call).
  std::function<void(ecclResult_t, const std::string&)> onRevoked;
  // With DeviceOptions::peersFromConnections: a member this device did not
  // know dialed it, proving the secret of `jobId`; it is now the candidate
  // peer `peer` (inboundPeer of the member). Called like onPeerFailure.
  std::function<void(MemberId peer, uint64_t jobId)> onPeerArrived;

  // Where lanes a member dialed to this device are filed when peers come
  // from connections, apart from the lanes this device dialed to it.
  static constexpr MemberId kInboundPeerBit = MemberId{1} << 63;
  static MemberId inboundPeer(MemberId member) { return member ^ kInboundPeerBit; }
};

}  // namespace eccl::transport
