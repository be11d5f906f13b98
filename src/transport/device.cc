#include "transport/device.h"

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
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "membership/handshake.h"
#include "common/crypto.h"
#include "common/error.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/netif.h"
#include "common/socket.h"
#include "transport/conduit.h"
#include "transport/frame.h"
#include "transport/shm/backend.h"
#include "transport/tcp/backend.h"
#include "transport/tcp/nic_affinity.h"

namespace eccl::transport {
namespace {

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
thread_local ThreadWakeFd t_wakeFd;
int threadWakeFd() { return t_wakeFd.peek(); }

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

constexpr size_t kReadBudgetPerEvent = 8 << 20;  // fairness between sockets
constexpr size_t kRxBufferBytes = 32 << 10;
constexpr size_t kDirectReadBytes = 8 << 10;  // payloads this large skip the receive buffer
constexpr uint64_t kWakeToken = 0;   // lane tokens start at 1
constexpr uint64_t kLanesToken = 1;  // in the progress thread's epoll only
// After a caller's wait the lanes stay with callers this long, so the next
// op's data does not wake the progress thread; it bounds how late an idle
// member answers a ping or notices a hang-up.
constexpr int64_t kLeaseMs = 2;

struct SendItem {
  uint8_t header[FrameHeader::kSize + FrameHeader::kSignatureBytes];
  size_t headerBytes = FrameHeader::kSize;  // with the call signature, when there is one
  const uint8_t* data = nullptr;
  size_t length = 0;
  size_t done = 0;  // bytes written, header included
  RequestPtr request;  // null for control frames
  std::vector<uint8_t> owned;  // control payloads
};

// One message being received, posted or not.
struct Inbox {
  RequestPtr request;          // null while nobody has posted the receive
  uint8_t* userBuffer = nullptr;
  // Data that arrived before the receive was posted (uninitialised, from
  // the device's pool of staging buffers).
  std::unique_ptr<uint8_t[]> staged;
  size_t stagedCapacity = 0;
  bool unexpected = false;
  size_t total = 0;
  size_t received = 0;
  bool checksummed = false;  // the sender sent the message's CRC32C
  uint32_t crc = 0;
  // Point-to-point call signatures: the receiver's and the sender's.
  std::optional<CallSignature> expected, sent;
  uint8_t* base() { return unexpected ? staged.get() : userBuffer; }
};

struct InboxKey {
  uint32_t epoch;  // a message belongs to one view; older ones die with it
  MemberId peer;
  uint64_t seq;
  uint32_t tag;
  auto operator<=>(const InboxKey&) const = default;
};

struct Lane {
  ConnKey key;
  uint64_t token = 0;  // epoll cookie; 0 while unconnected
  std::unique_ptr<Conduit> conduit;
  bool wantOut = false;
  bool saidGoodbye = false;  // the peer's goodbye arrived on this lane
  bool opened = false;       // connected once (it may be closed again)
  std::deque<SendItem> sendQueue;
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
};

struct Peer {
  enum class State { kIdle, kConnecting, kUp, kFailed, kLeft };
  MemberId id = 0;
  SockAddr address;
  std::string label;
  Device::PeerRole role = Device::PeerRole::kViewMember;
  State state = State::kIdle;
  ecclResult_t failCode = ecclSuccess;
  std::string failReason;
  std::vector<std::unique_ptr<Lane>> lanes;
  Backend* backend = nullptr;  // chosen by the lane that connects first
  uint32_t nextLane = 0;
  Clock::time_point lastPong{};  // the peer's progress thread answered a ping
  bool leftReported = false;     // left in order, then an op needed it
};

class LaneDevice final : public Device {
 public:
  explicit LaneDevice(const DeviceOptions& o);
  ~LaneDevice() override;

  MemberId self() const override { return opt_.self; }
  std::string address() const override { return tcp_->address().str(); }
  void addPeer(MemberId member, const std::string& address, const std::string& label, PeerRole role) override;
  uint32_t lanesUp(MemberId member) const override {
    MutexLock lock(mu_);
    auto it = peers_.find(member);
    if (it == peers_.end()) return 0;
    uint32_t up = 0;
    for (auto& lane : it->second.lanes) up += bool(lane->conduit);
    return up;
  }
  bool hasPeer(MemberId member) const override {
    MutexLock lock(mu_);
    auto it = peers_.find(member);
    return it != peers_.end() && it->second.state != Peer::State::kFailed && it->second.state != Peer::State::kLeft;
  }
  void setEpoch(uint32_t epoch) override {
    MutexLock lock(mu_);
    epoch_ = epoch;
  }
  void setLabel(const std::string& label) override {
    MutexLock lock(mu_);
    selfLabel_ = label;
  }
  RequestPtr isend(MemberId peer, uint64_t seq, uint32_t tag, const void* buf, size_t len,
                   const uint32_t* payloadCrc, const CallSignature* signature) override;
  RequestPtr irecv(MemberId peer, uint64_t seq, uint32_t tag, void* buf, size_t len,
                   const CallSignature* signature) override;
  void beginCall(uint64_t seq, const CallSignature& signature) override {
    MutexLock lock(mu_);
    checkLocalSignatureLocked(seq, signature);
  }
  void wait(const RequestPtr& request, Deadline deadline, const std::string& opName) override;
  bool test(const RequestPtr& request, const std::string& opName) override;
  void progress() override;
  void failPeer(MemberId member, ecclResult_t code, const std::string& reason) override {
    MutexLock lock(mu_);
    // A notice can outrun the view that names the member (the coordinator
    // fails a rank while this process is still entering that view): it is
    // kept and applied when the member is added.
    if (!peers_.count(member)) failedBeforeKnown_[member] = {code, reason};
    // What the member sent before it died is read first: a survivor that
    // reported another's failure and then exited often raced its own
    // notice, and the notice names the real culprit.
    if (auto it = peers_.find(member); it != peers_.end() && it->second.state != Peer::State::kFailed)
      for (auto& lane : it->second.lanes)
        if (lane->conduit && it->second.state != Peer::State::kFailed) readLocked(*lane);
    failPeerLocked(member, code, reason, /*flood=*/true);
  }
  void abort(const std::string& reason) override;
  void close(Deadline deadline) override;
  void removePeer(MemberId member) override;
  void beginEpoch(uint32_t epoch) override;
  void connectNow(MemberId member, Deadline deadline) override;
  DeviceStats stats() const override {
    MutexLock lock(mu_);
    DeviceStats s = stats_;
    for (auto& [token, lane] : lanesByToken_) {
      s.openConnections += lane != nullptr;
      s.openShmConnections += lane && lane->conduit->pollsMemory();
    }
    return s;
  }

 private:
  Peer& peerLocked(MemberId member) ECCL_REQUIRES(mu_);
  std::string labelLocked(MemberId member) ECCL_REQUIRES(mu_);
  void connectPeer(MemberId member) ECCL_EXCLUDES(mu_);
  void installLaneLocked(Peer& peer, uint32_t lane, std::unique_ptr<Conduit> conduit) ECCL_REQUIRES(mu_);
  bool armLanesLocked() ECCL_REQUIRES(mu_);
  Backend* backendFor(MemberId member, const SockAddr& address, Deadline deadline, const std::string& what,
                      const std::function<bool()>& giveUp, Fd* stream);
  void closeLaneLocked(Lane& lane) ECCL_REQUIRES(mu_);
  void flushLocked(Lane& lane) ECCL_REQUIRES(mu_);
  void setWantOutLocked(Lane& lane, bool on) ECCL_REQUIRES(mu_);
  void updateEpollLocked(Lane& lane, int op) ECCL_REQUIRES(mu_);
  void waitSliceLocked(const RequestPtr& r, Deadline until) ECCL_REQUIRES(mu_);
  bool driveLocked(const RequestPtr& r, Deadline until) ECCL_REQUIRES(mu_);
  void setCallerOwnedLocked(bool owned) ECCL_REQUIRES(mu_);
  void serviceLanesLocked(bool sockets = true) ECCL_REQUIRES(mu_);
  void completeLocked(const RequestPtr& r, ecclResult_t code, std::string error) ECCL_REQUIRES(mu_);
  void failPeerLocked(MemberId member, ecclResult_t code, const std::string& reason, bool flood)
      ECCL_REQUIRES(mu_);
  void markLeftLocked(Peer& peer) ECCL_REQUIRES(mu_);
  void acceptLaneLocked(MemberId from, uint32_t lane, Backend* backend, std::unique_ptr<Conduit> conduit,
                        const std::string& what) ECCL_REQUIRES(mu_);
  void acceptOne(Backend& backend);
  void installParkedLocked(MemberId member) ECCL_REQUIRES(mu_);
  void dropExpiredParkedLocked() ECCL_REQUIRES(mu_);
  void leftPeerNeededLocked(Peer& peer) ECCL_REQUIRES(mu_);
  void floodNoticeLocked(MemberId member, const std::string& reason) ECCL_REQUIRES(mu_);
  void discardOrphanedPayloadsLocked() ECCL_REQUIRES(mu_);
  void queueControlLocked(Lane& lane, FrameType type, std::vector<uint8_t> payload) ECCL_REQUIRES(mu_);
  // fromSeq > 0: collectives numbered below it are unaffected (every rank
  // has sent its part of them), so ranks still finishing one complete it.
  void revokeLocked(ecclResult_t code, const std::string& reason, uint64_t fromSeq = 0) ECCL_REQUIRES(mu_);
  bool revokesLocked(uint64_t seq) const ECCL_REQUIRES(mu_);
  void floodRevokeLocked(ecclResult_t code, const std::string& reason, uint64_t fromSeq) ECCL_REQUIRES(mu_);
  void checkLocalSignatureLocked(uint64_t seq, const CallSignature& mine) ECCL_REQUIRES(mu_);
  void callMismatchLocked(MemberId peer, uint64_t seq, const CallSignature& mine, const CallSignature& theirs)
      ECCL_REQUIRES(mu_);
  bool pingLocked(MemberId member, uint64_t seq = 0) ECCL_REQUIRES(mu_);
  void answerPingLocked(Lane& lane) ECCL_REQUIRES(mu_);
  void onPongSignatureLocked(Lane& lane) ECCL_REQUIRES(mu_);

  void progressLoop();
  void acceptLoop();
  void readLocked(Lane& lane) ECCL_REQUIRES(mu_);
  uint8_t* rxDestinationLocked(Lane& lane, size_t* want) ECCL_REQUIRES(mu_);
  bool advanceLocked(Lane& lane, size_t got) ECCL_REQUIRES(mu_);
  bool onHeaderLocked(Lane& lane) ECCL_REQUIRES(mu_);
  bool onSignatureLocked(Lane& lane) ECCL_REQUIRES(mu_);
  bool onDataFrameLocked(Lane& lane, const CallSignature* signature) ECCL_REQUIRES(mu_);
  void onPayloadDoneLocked(Lane& lane) ECCL_REQUIRES(mu_);
  bool checksumHoldsLocked(Inbox& box, const std::string& peerLabel) ECCL_REQUIRES(mu_);
  void takeStagingLocked(Inbox& box, size_t bytes) ECCL_REQUIRES(mu_);
  void recycleStagingLocked(Inbox& box) ECCL_REQUIRES(mu_);
  void onControlLocked(Lane& lane) ECCL_REQUIRES(mu_);
  void wakeLoop();

  const DeviceOptions opt_;
  // Back ends in the order a dial tries them.
  std::unique_ptr<TcpBackend> tcp_;
  std::unique_ptr<shm::ShmBackend> shm_;
  std::vector<Backend*> backends_;
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

  mutable Mutex mu_;
  CondVar cv_;
  uint32_t epoch_ ECCL_GUARDED_BY(mu_) = 0;
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
  std::map<MemberId, Peer> peers_ ECCL_GUARDED_BY(mu_);
  std::map<MemberId, std::pair<ecclResult_t, std::string>> failedBeforeKnown_ ECCL_GUARDED_BY(mu_);
  std::set<MemberId> candidateFailed_ ECCL_GUARDED_BY(mu_);  // failed while only a candidate
  struct Parked {
    MemberId from;
    uint32_t lane;
    Backend* backend;
    std::unique_ptr<Conduit> conduit;
    Deadline deadline;
    std::string what;
  };
  std::vector<Parked> parked_ ECCL_GUARDED_BY(mu_);  // authenticated, from a member not known yet
  std::map<uint64_t, Lane*> lanesByToken_ ECCL_GUARDED_BY(mu_);
  std::vector<Lane*> memoryLanes_ ECCL_GUARDED_BY(mu_);  // lanes that pollsMemory()
  uint64_t nextToken_ ECCL_GUARDED_BY(mu_) = 1;
  std::map<InboxKey, Inbox> inbox_ ECCL_GUARDED_BY(mu_);
  bool callerOwned_ ECCL_GUARDED_BY(mu_) = false;
  int drivers_ ECCL_GUARDED_BY(mu_) = 0;
  Clock::time_point leaseUntil_ ECCL_GUARDED_BY(mu_){};
  std::vector<std::pair<std::unique_ptr<uint8_t[]>, size_t>> stagingPool_ ECCL_GUARDED_BY(mu_);
  size_t stagingPoolBytes_ ECCL_GUARDED_BY(mu_) = 0;
  DeviceStats stats_ ECCL_GUARDED_BY(mu_);
};

LaneDevice::LaneDevice(const DeviceOptions& o) : opt_(o) {
  // TCP always listens: its address is how the membership names a member,
  // and members on other hosts reach it that way.
  tcp_ = std::make_unique<TcpBackend>(o.ifname);
  if (o.transport != TransportChoice::kTcp) {
    try {
      shm_ = std::make_unique<shm::ShmBackend>(shm::ShmOptions{o.jobId, o.self, tcp_->address(), o.shmRingBytes});
      backends_.push_back(shm_.get());
    } catch (const Error& e) {
      if (o.transport == TransportChoice::kShm) throw;
      log::warn("member {}: no shared-memory lanes ({}); using TCP only", o.self, e.what());
    }
  }
  if (o.transport != TransportChoice::kShm) backends_.push_back(tcp_.get());
  epollFd_.reset(epoll_create1(EPOLL_CLOEXEC));
  laneEpoll_.reset(epoll_create1(EPOLL_CLOEXEC));
  eventFd_.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!epollFd_ || !laneEpoll_ || !eventFd_)
    fail(ecclSystemError, "epoll/eventfd creation failed: {}", strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeToken;
  epoll_ctl(epollFd_.get(), EPOLL_CTL_ADD, eventFd_.get(), &ev);
  ev.data.u64 = kLanesToken;
  epoll_ctl(epollFd_.get(), EPOLL_CTL_ADD, laneEpoll_.get(), &ev);
  progressThread_ = std::thread([this] { progressLoop(); });
  acceptThread_ = std::thread([this] {
    acceptLoop();
    releaseThreadCryptoState();
  });
  log::info("member {} listening on {} (interface {}){}, {} lanes per peer", o.self, address(),
            tcp_->interface().name, shm_ ? " and on shared memory" : "", o.lanes);
}

LaneDevice::~LaneDevice() {
  stopping_ = true;
  wakeLoop();
  if (progressThread_.joinable()) progressThread_.join();
  if (acceptThread_.joinable()) acceptThread_.join();
  MutexLock lock(mu_);
  for (auto& [id, peer] : peers_)
    for (auto& lane : peer.lanes) closeLaneLocked(*lane);
  for (auto& [key, box] : inbox_)
    if (box.request) completeLocked(box.request, ecclInvalidUsage, "communicator destroyed");
}

void LaneDevice::wakeLoop() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t rc = ::write(eventFd_.get(), &one, sizeof(one));
}

void LaneDevice::addPeer(MemberId member, const std::string& address, const std::string& label, PeerRole role) {
  SockAddr addr = SockAddr::parse(address);
  MutexLock lock(mu_);
  Peer& p = peers_[member];
  p.id = member;
  p.address = addr;
  p.label = label;
  // A view member never becomes a candidate again: a late standby list must
  // not soften the failure of a member promoted meanwhile.
  if (role == PeerRole::kViewMember || p.lanes.empty()) p.role = role;
  if (p.lanes.empty()) {
    for (int i = 0; i < opt_.lanes; ++i) {
      auto lane = std::make_unique<Lane>();
      lane->key = ConnKey{opt_.self, member, static_cast<uint32_t>(i)};
      p.lanes.push_back(std::move(lane));
    }
  }
  // A candidate's failure was nobody's (an eager standby's warm-up dial that
  // did not get through): once the view names it, it gets a fresh start.
  if (role == PeerRole::kViewMember && p.state == Peer::State::kFailed && candidateFailed_.erase(member)) {
    for (auto& lane : p.lanes) closeLaneLocked(*lane), lane->opened = false, lane->saidGoodbye = false;
    p.state = Peer::State::kIdle;
    p.backend = nullptr;
  }
  installParkedLocked(member);
  if (auto early = failedBeforeKnown_.find(member); early != failedBeforeKnown_.end()) {
    auto [code, reason] = early->second;
    failedBeforeKnown_.erase(early);
    failPeerLocked(member, code, reason, /*flood=*/false);
  }
  cv_.notifyAll();  // the accept thread may be waiting for this member
}

Peer& LaneDevice::peerLocked(MemberId member) {
  auto it = peers_.find(member);
  if (it == peers_.end()) fail(ecclInvalidArgument, "member {} is not a peer of member {}", member, opt_.self);
  return it->second;
}

std::string LaneDevice::labelLocked(MemberId member) {
  auto it = peers_.find(member);
  return it == peers_.end() ? fmt::format("member {}", member) : it->second.label;
}

void LaneDevice::connectPeer(MemberId member) {
  SockAddr addr;
  std::string label;
  {
    MutexLock lock(mu_);
    Peer& p = peerLocked(member);
    // The lower member id opens the connection; the higher one accepts.
    if (p.state != Peer::State::kIdle || opt_.self > member) return;
    p.state = Peer::State::kConnecting;
    addr = p.address;
    label = p.label;
  }
  std::vector<std::unique_ptr<Conduit>> conduits;
  Backend* backend = nullptr;
  try {
    Deadline deadline = deadlineAfterMs(opt_.handshakeTimeoutMs);
    auto giveUp = [this, member] {
      MutexLock lock(mu_);
      auto it = peers_.find(member);
      return stopping_ || it == peers_.end() || it->second.state != Peer::State::kConnecting;
    };
    for (int i = 0; i < opt_.lanes; ++i) {
      std::string what = fmt::format("connecting lane {} to peer {}", i, label);
      Fd stream;
      if (!backend)
        backend = backendFor(member, addr, deadline, what, giveUp, &stream);
      else
        stream = backend->dial(member, addr, deadline, what, giveUp);
      if (!stream) fail(ecclRemoteError, "{}: peer no longer reachable over {}", what, backend->name());
      membership::Hello hello{membership::Purpose::kData, opt_.jobId, opt_.self, member, static_cast<uint32_t>(i)};
      membership::authenticateAsClient(stream.get(), opt_.secret, hello, deadline, what);
      conduits.push_back(backend->openDialed(std::move(stream), deadline, what));
    }
  } catch (const Error& e) {
    MutexLock lock(mu_);
    failPeerLocked(member, e.code() == ecclAuthError ? ecclAuthError : ecclRemoteError, e.what(), true);
    return;
  }
  MutexLock lock(mu_);
  Peer& p = peerLocked(member);
  if (p.state != Peer::State::kConnecting) return;  // failed meanwhile
  p.backend = backend;
  for (int i = 0; i < opt_.lanes; ++i) installLaneLocked(p, static_cast<uint32_t>(i), std::move(conduits[i]));
}

// The first back end that reaches the member carries all its lanes.
Backend* LaneDevice::backendFor(MemberId member, const SockAddr& address, Deadline deadline, const std::string& what,
                               const std::function<bool()>& giveUp, Fd* stream) {
  for (Backend* backend : backends_) {
    *stream = backend->dial(member, address, deadline, what, giveUp);
    if (*stream) return backend;
  }
  fail(ecclInvalidUsage,
       "{}: ECCL_TRANSPORT=shm, but the peer is not reachable over shared memory (another host or network "
       "namespace)",
       what);
}

void LaneDevice::installLaneLocked(Peer& peer, uint32_t index, std::unique_ptr<Conduit> conduit) {
  Lane& lane = *peer.lanes[index];
  lane.conduit = std::move(conduit);
  if (lane.conduit->pollsMemory()) memoryLanes_.push_back(&lane);
  log::info("member {}: lane {} to peer {} is up over {}", opt_.self, index, peer.label, lane.conduit->kind());
  lane.token = nextToken_++;
  lane.opened = true;
  lane.rx = Lane::Rx::kHeader;
  lane.headerGot = 0;
  lane.rxBegin = lane.rxEnd = 0;
  if (!lane.rxBuffer) lane.rxBuffer.reset(new uint8_t[kRxBufferBytes]);
  lanesByToken_[lane.token] = &lane;
  lane.wantOut = false;
  updateEpollLocked(lane, EPOLL_CTL_ADD);
  stats_.connectionsOpened++;
  if (closing_) queueControlLocked(lane, FrameType::kGoodbye, {});
  bool allUp = std::all_of(peer.lanes.begin(), peer.lanes.end(), [](auto& l) { return bool(l->conduit); });
  if (allUp) peer.state = Peer::State::kUp;
  cv_.notifyAll();
  flushLocked(lane);
}

void LaneDevice::closeLaneLocked(Lane& lane) {
  if (!lane.conduit) return;
  epoll_ctl(laneEpoll_.get(), EPOLL_CTL_DEL, lane.conduit->pollFd(), nullptr);
  lanesByToken_.erase(lane.token);
  std::erase(memoryLanes_, &lane);
  lane.token = 0;
  lane.conduit.reset();
  lane.sendQueue.clear();
  lane.rxBegin = lane.rxEnd = 0;
  stats_.connectionsClosed++;
}

void LaneDevice::setWantOutLocked(Lane& lane, bool on) {
  if (lane.wantOut == on || !lane.conduit || !lane.conduit->writableByPoll()) return;
  lane.wantOut = on;
  updateEpollLocked(lane, EPOLL_CTL_MOD);
}

void LaneDevice::updateEpollLocked(Lane& lane, int op) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | (lane.wantOut ? uint32_t{EPOLLOUT} : 0u);
  ev.data.u64 = lane.token;
  epoll_ctl(laneEpoll_.get(), op, lane.conduit->pollFd(), &ev);
}

void LaneDevice::setCallerOwnedLocked(bool owned) {
  if (callerOwned_ == owned) return;
  callerOwned_ = owned;
  epoll_event ev{};
  ev.events = owned ? 0u : uint32_t{EPOLLIN};
  ev.data.u64 = kLanesToken;
  epoll_ctl(epollFd_.get(), EPOLL_CTL_MOD, laneEpoll_.get(), &ev);
}

// Reads and writes whatever the lanes are ready for, without blocking.
void LaneDevice::serviceLanesLocked(bool sockets) {
  epoll_event events[64];
  int n = sockets ? epoll_wait(laneEpoll_.get(), events, 64, 0) : 0;
  for (int i = 0; i < n; ++i) {
    uint64_t token = events[i].data.u64;
    auto it = lanesByToken_.find(token);
    if (it == lanesByToken_.end()) continue;  // closed since epoll_wait returned
    Lane& lane = *it->second;
    const bool readable = events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR);
    if (readable) lane.conduit->onPollReady();
    if ((events[i].events & EPOLLOUT) || (readable && !lane.conduit->writableByPoll())) flushLocked(lane);
    if (lane.token == token && readable) readLocked(lane);
  }
  // Lanes in memory announce nothing while their peer is awake: look.
  for (size_t i = 0; i < memoryLanes_.size(); ++i) {
    Lane& lane = *memoryLanes_[i];
    const uint64_t token = lane.token;
    if (!lane.sendQueue.empty()) flushLocked(lane);
    if (lane.token == token && lane.conduit) readLocked(lane);
    if (i < memoryLanes_.size() && memoryLanes_[i] != &lane) --i;  // closed meanwhile
  }
}

// Before sleeping: every lane in memory must ring the lanes' descriptors
// for whatever comes next; false when something is there already.
bool LaneDevice::armLanesLocked() {
  for (Lane* lane : memoryLanes_)
    if (!lane->conduit->armWakeup(!lane->sendQueue.empty())) return false;
  return true;
}

void LaneDevice::completeLocked(const RequestPtr& r, ecclResult_t code, std::string error) {
  if (r->state.load() != Request::kPending) return;
  r->code = code;
  r->error = std::move(error);
  r->state.store(code == ecclSuccess ? Request::kDone : Request::kFailed);
  cv_.notifyAll();
  if (r->driverWakeFd >= 0 && r->driverWakeFd != threadWakeFd()) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t rc = ::write(r->driverWakeFd, &one, sizeof(one));
  }
}

void LaneDevice::flushLocked(Lane& lane) {
  while (lane.conduit && !lane.sendQueue.empty()) {
    SendItem& item = lane.sendQueue.front();
    iovec iov[2];
    int n = 0;
    if (item.done < item.headerBytes) {
      iov[n++] = {item.header + item.done, item.headerBytes - item.done};
      if (item.length) iov[n++] = {const_cast<uint8_t*>(item.data), item.length};
    } else {
      size_t off = item.done - item.headerBytes;
      iov[n++] = {const_cast<uint8_t*>(item.data) + off, item.length - off};
    }
    ssize_t rc = lane.conduit->write(iov, n);
    if (rc == 0) break;
    if (rc < 0) {
      failPeerLocked(lane.key.remote, ecclRemoteError,
                     fmt::format("peer {}: send on lane {} failed: {}", labelLocked(lane.key.remote),
                                 lane.key.lane, strerror(errno)),
                     true);
      return;
    }
    item.done += static_cast<size_t>(rc);
    stats_.bytesSent += static_cast<size_t>(rc);
    if (item.done < item.headerBytes + item.length) break;
    RequestPtr r = std::move(item.request);
    lane.sendQueue.pop_front();
    if (r && --r->pendingChunks == 0) completeLocked(r, ecclSuccess, {});
  }
  setWantOutLocked(lane, !lane.sendQueue.empty());
}

RequestPtr LaneDevice::isend(MemberId member, uint64_t seq, uint32_t tag, const void* buf, size_t len,
                            const uint32_t* payloadCrc, const CallSignature* signature) {
  connectPeer(member);
  auto r = std::make_shared<Request>();
  r->peer = member;
  r->seq = seq;
  r->isSend = true;
  r->survivesRevocation = FrameHeader::survivesRevocation(seq);
  MutexLock lock(mu_);
  Peer& p = peerLocked(member);
  if (aborted_) {
    completeLocked(r, ecclRemoteError, abortReason_);
    return r;
  }
  if (revokesLocked(seq)) {
    completeLocked(r, revokedCode_, revokedReason_);
    return r;
  }
  if (p.state == Peer::State::kFailed || p.state == Peer::State::kLeft) {
    completeLocked(r, p.failCode, p.failReason);
    if (p.state == Peer::State::kLeft && !r->survivesRevocation) leftPeerNeededLocked(p);
    return r;
  }
  const size_t lanes = p.lanes.size();
  size_t chunk = len;
  if (lanes > 1 && static_cast<int64_t>(len) >= opt_.stripeMinBytes)
    chunk = ((len + lanes - 1) / lanes + 4095) & ~size_t(4095);
  chunk = std::min<size_t>(std::max<size_t>(chunk, 1), FrameHeader::kMaxPayload);
  const auto* data = static_cast<const uint8_t*>(buf);
  uint64_t touched = 0;  // lane indexes (at most 64 lanes)
  size_t offset = 0;
  do {
    size_t n = std::min(chunk, len - offset);
    const size_t index = p.nextLane++ % lanes;
    Lane& lane = *p.lanes[index];
    SendItem item;
    FrameHeader h;
    h.type = FrameType::kData;
    h.epoch = epoch_;
    h.commId = opt_.commId;
    h.seq = seq;
    h.tag = tag;
    h.length = static_cast<uint32_t>(n);
    h.offset = offset;
    h.total = len;
    if (payloadCrc) h.flags = FrameHeader::kPayloadChecksum, h.payloadCrc = *payloadCrc;
    if (signature && offset == 0) {
      uint8_t* bytes = item.header + FrameHeader::kSize;
      encodeSignature(*signature, bytes);
      h.flags |= FrameHeader::kCallSignature;
      h.signatureCrc = crc32c(bytes, FrameHeader::kSignatureBytes);
      item.headerBytes += FrameHeader::kSignatureBytes;
    }
    encodeFrame(h, item.header);
    item.data = data + offset;
    item.length = n;
    item.request = r;
    r->pendingChunks++;
    lane.sendQueue.push_back(std::move(item));
    touched |= uint64_t{1} << index;
    offset += n;
  } while (offset < len);
  for (size_t i = 0; i < lanes; ++i)
    if (touched & (uint64_t{1} << i)) flushLocked(*p.lanes[i]);
  return r;
}

RequestPtr LaneDevice::irecv(MemberId member, uint64_t seq, uint32_t tag, void* buf, size_t len,
                            const CallSignature* signature) {
  connectPeer(member);
  auto r = std::make_shared<Request>();
  r->peer = member;
  r->seq = seq;
  r->survivesRevocation = FrameHeader::survivesRevocation(seq);
  MutexLock lock(mu_);
  Peer& p = peerLocked(member);
  if (aborted_) {
    completeLocked(r, ecclRemoteError, abortReason_);
    return r;
  }
  const bool p2pChecked = signature && !FrameHeader::isCollective(seq) && !r->survivesRevocation;
  InboxKey key{epoch_, member, seq, tag};
  auto it = inbox_.find(key);
  if (p2pChecked && it != inbox_.end() && it->second.sent && !signaturesAgree(*signature, *it->second.sent))
    callMismatchLocked(member, seq, *signature, *it->second.sent);
  if (revokesLocked(seq)) {
    completeLocked(r, revokedCode_, revokedReason_);
    return r;
  }
  if (it != inbox_.end()) {
    Inbox& box = it->second;
    if (box.total != len) {
      completeLocked(r, ecclInvalidUsage,
                     fmt::format("peer {} sent {} bytes where {} were expected (mismatched counts or types)",
                                 p.label, box.total, len));
      if (box.received == box.total) inbox_.erase(it);
      return r;
    }
    box.request = r;
    box.userBuffer = static_cast<uint8_t*>(buf);
    if (box.received == box.total) {
      if (!checksumHoldsLocked(box, p.label)) {
        inbox_.erase(it);
        return r;
      }
      if (len) std::memcpy(buf, box.staged.get(), len);
      recycleStagingLocked(box);
      completeLocked(r, ecclSuccess, {});
      inbox_.erase(it);
    }
    return r;
  }
  if (p.state == Peer::State::kFailed || p.state == Peer::State::kLeft) {
    completeLocked(r, p.failCode, p.failReason);
    if (p.state == Peer::State::kLeft && !r->survivesRevocation) leftPeerNeededLocked(p);
    return r;
  }
  Inbox& box = inbox_[key];
  box.request = r;
  box.userBuffer = static_cast<uint8_t*>(buf);
  box.total = len;
  if (p2pChecked) box.expected = *signature;
  return r;
}

void LaneDevice::wait(const RequestPtr& r, Deadline deadline, const std::string& opName) {
  MutexLock lock(mu_);
  bool probed = false;
  const auto timeout = deadline - Clock::now();
  while (r->state.load() == Request::kPending) {
    waitSliceLocked(r, deadline);
    if (r->state.load() != Request::kPending || Clock::now() < deadline) continue;
    // At the deadline, ask the peer's progress thread whether the process
    // is alive. A live peer that is itself blocked on a failed member will
    // report that member soon, so we wait once more; a stopped or hung
    // process cannot answer and is declared failed.
    if (!probed && pingLocked(r->peer, r->seq)) {
      probed = true;
      auto sent = Clock::now();
      auto grace = std::min<Clock::duration>(std::chrono::milliseconds(500), timeout);
      while (r->state.load() == Request::kPending && peerLocked(r->peer).lastPong < sent &&
             Clock::now() < sent + grace)
        waitSliceLocked(r, sent + grace);
      if (r->state.load() != Request::kPending) break;
      if (peerLocked(r->peer).lastPong >= sent) {
        deadline = Clock::now() + timeout;
        continue;
      }
    }
    failPeerLocked(r->peer, ecclTimeout,
                   fmt::format("peer {} did not {} before the deadline and does not answer (timed out; stopped "
                               "or hung process?)",
                               labelLocked(r->peer), r->isSend ? "accept our data" : "send its data"),
                   true);
    completeLocked(r, ecclTimeout, fmt::format("peer {} timed out", labelLocked(r->peer)));
  }
  if (r->state.load() == Request::kFailed)
    throw Error(r->code, opName.empty() ? r->error : fmt::format("{}: {}", opName, r->error));
}

// Waits until the request completes, `until` passes or something happens
// that the caller should look at. Where the peer's lanes are all up the
// caller drives them itself; otherwise the progress thread does and wakes
// the condition variable.
void LaneDevice::waitSliceLocked(const RequestPtr& r, Deadline until) {
  if (!driveLocked(r, until)) cv_.waitUntil(mu_, until);
}

bool LaneDevice::driveLocked(const RequestPtr& r, Deadline until) {
  const int wakeFd = t_wakeFd.get();
  if (wakeFd < 0 || stopping_) return false;
  r->driverWakeFd = wakeFd;
  drivers_++;
  setCallerOwnedLocked(true);
  const auto spinUntil = Clock::now() + std::chrono::microseconds(opt_.spinUs);
  unsigned pass = 0;
  while (r->state.load() == Request::kPending) {
    // Sockets cost a system call to look at and lanes in memory do not:
    // while spinning over memory, the sockets get every 8th pass, and so
    // does the scheduler (a peer on this core needs it to produce).
    const bool memory = !memoryLanes_.empty();
    const bool syscallPass = !memory || ++pass % 8 == 0;
    serviceLanesLocked(syscallPass);
    if (r->state.load() != Request::kPending) break;
    // The clock is read on the passes that make system calls anyway.
    auto now = syscallPass ? Clock::now() : spinUntil - std::chrono::nanoseconds(1);
    if (now >= until) break;
    if (now < spinUntil) {
      mu_.unlock();
      if (syscallPass)
        sched_yield();
      else
        for (int i = 0; i < 4; ++i) cpuRelax();
      mu_.lock();
      continue;
    }
    if (!armLanesLocked()) continue;
    pollfd fds[2] = {{laneEpoll_.get(), POLLIN, 0}, {wakeFd, POLLIN, 0}};
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(until - now).count();
    mu_.unlock();
    int ready = ::poll(fds, 2, static_cast<int>(std::min<int64_t>(ms, 1000)));
    if (ready > 0 && (fds[1].revents & POLLIN)) {
      uint64_t drained;
      [[maybe_unused]] ssize_t rc = ::read(wakeFd, &drained, sizeof(drained));
    }
    mu_.lock();
  }
  r->driverWakeFd = -1;
  drivers_--;
  leaseUntil_ = Clock::now() + std::chrono::milliseconds(kLeaseMs);
  return true;
}

bool LaneDevice::pingLocked(MemberId member, uint64_t seq) {
  auto it = peers_.find(member);
  if (it == peers_.end() || it->second.lanes.empty() || !it->second.lanes[0]->conduit) return false;
  std::vector<uint8_t> payload;
  if (seq != 0 && FrameHeader::isCollective(seq) && signatures_.mine(epoch_, seq)) {
    payload.resize(8);
    std::memcpy(payload.data(), &seq, 8);
  }
  queueControlLocked(*it->second.lanes[0], FrameType::kPing, std::move(payload));
  return true;
}

// A ping that names a collective asks what the peer called there: two ranks
// that disagree without sending each other anything (both think they are
// the root of a reduce) learn it at the deadline instead of declaring a
// live peer failed.
void LaneDevice::answerPingLocked(Lane& lane) {
  std::vector<uint8_t> payload;
  if (lane.control.size() == 8) {
    uint64_t seq;
    std::memcpy(&seq, lane.control.data(), 8);
    payload.assign(lane.control.begin(), lane.control.end());
    if (auto mine = signatures_.mine(lane.frame.epoch, seq); mine && lane.frame.epoch == epoch_) {
      payload.resize(8 + CallSignature::kWireBytes);
      encodeSignature(*mine, payload.data() + 8);
    }
  }
  queueControlLocked(lane, FrameType::kPong, std::move(payload));
}

void LaneDevice::onPongSignatureLocked(Lane& lane) {
  if (lane.control.size() != 8 + CallSignature::kWireBytes || lane.frame.epoch != epoch_) return;
  uint64_t seq;
  std::memcpy(&seq, lane.control.data(), 8);
  auto mine = signatures_.mine(epoch_, seq);
  auto theirs = decodeSignature(lane.control.data() + 8, nullptr);
  if (mine && theirs && !signaturesAgree(*mine, *theirs)) callMismatchLocked(lane.key.remote, seq, *mine, *theirs);
}

bool LaneDevice::revokesLocked(uint64_t seq) const {
  if (revokedCode_ == ecclSuccess || FrameHeader::survivesRevocation(seq)) return false;
  return !(FrameHeader::isCollective(seq) && seq < revokedFromSeq_);
}

void LaneDevice::revokeLocked(ecclResult_t code, const std::string& reason, uint64_t fromSeq) {
  if (revokedCode_ != ecclSuccess) return;
  revokedCode_ = code;
  revokedReason_ = reason;
  revokedFromSeq_ = fromSeq;
  // Failed sends must never read their buffers again: drop queued data
  // frames. A half-written one is finished from a private copy of its tail,
  // so the lane stays whole and is inherited by the next view (the receiver
  // discards the frame as part of a dead op).
  for (auto& [id, p] : peers_) {
    for (auto& lane : p.lanes) {
      std::deque<SendItem> keep;
      for (auto& item : lane->sendQueue) {
        if (item.request && !revokesLocked(item.request->seq)) {
          keep.push_back(std::move(item));
          continue;
        }
        if (item.request) completeLocked(item.request, code, reason);
        bool torn = item.request && item.done > 0;
        if (torn) {
          item.owned.assign(item.data, item.data + item.length);
          item.data = item.owned.data();
          item.request.reset();
          keep.push_back(std::move(item));
        } else if (!item.request) {
          keep.push_back(std::move(item));
        }
      }
      lane->sendQueue = std::move(keep);
    }
  }
  // Buffers of failed receives must never be written again.
  for (auto box = inbox_.begin(); box != inbox_.end();) {
    bool dies = box->second.request && revokesLocked(box->second.request->seq);
    if (dies) completeLocked(box->second.request, code, reason);
    box = dies ? inbox_.erase(box) : std::next(box);
  }
  discardOrphanedPayloadsLocked();
}

void LaneDevice::floodRevokeLocked(ecclResult_t code, const std::string& reason, uint64_t fromSeq) {
  for (auto& [id, other] : peers_) {
    if (other.state == Peer::State::kFailed || other.lanes.empty() || other.role == PeerRole::kCandidate) continue;
    Lane& lane = *other.lanes[0];
    if (!lane.conduit) continue;
    std::vector<uint8_t> payload(12 + reason.size());
    std::memcpy(payload.data(), &fromSeq, 8);
    auto c = static_cast<uint32_t>(code);
    std::memcpy(payload.data() + 8, &c, 4);
    std::memcpy(payload.data() + 12, reason.data(), reason.size());
    if (payload.size() > FrameHeader::kMaxControlPayload) payload.resize(FrameHeader::kMaxControlPayload);
    queueControlLocked(lane, FrameType::kRevoke, std::move(payload));
  }
}

// Each collective enters this rank's signature as it starts; a peer's
// frame that got here first is compared now.
void LaneDevice::checkLocalSignatureLocked(uint64_t seq, const CallSignature& mine) {
  if (seq == lastCheckedSeq_) return;
  lastCheckedSeq_ = seq;
  if (auto m = signatures_.local(epoch_, seq, mine)) callMismatchLocked(m->peer, seq, mine, m->theirs);
}

// Ranks disagree about a call: from this op on the communicator is
// revoked with ecclInvalidUsage naming both calls, here and everywhere
// (the ranks that agreed would otherwise wait for data that never comes).
void LaneDevice::callMismatchLocked(MemberId peer, uint64_t seq, const CallSignature& mine,
                                   const CallSignature& theirs) {
  if (revokedCode_ != ecclSuccess) return;  // revoked already, for a reason that came first
  bool collective = FrameHeader::isCollective(seq);
  std::string reason = fmt::format("ranks disagree about {} (epoch {}): {} called {}, {} called {}",
                                   collective ? fmt::format("collective op {}", seq) : std::string("a send/recv pair"),
                                   epoch_, selfLabel_, describe(mine), labelLocked(peer), describe(theirs));
  log::warn("{}", reason);
  uint64_t fromSeq = collective ? seq : 0;
  revokeLocked(ecclInvalidUsage, reason, fromSeq);
  floodRevokeLocked(ecclInvalidUsage, reason, fromSeq);
  if (onRevoked) onRevoked(ecclInvalidUsage, reason);
}

void LaneDevice::discardOrphanedPayloadsLocked() {
  for (auto& [token, lane] : lanesByToken_)
    if (lane->rx == Lane::Rx::kPayload && lane->frame.type == FrameType::kData && !inbox_.count(lane->inboxKey))
      lane->discarding = true;
}

void LaneDevice::removePeer(MemberId member) {
  MutexLock lock(mu_);
  auto it = peers_.find(member);
  if (it == peers_.end()) return;
  Peer& p = it->second;
  std::string reason = fmt::format("peer {} is not in the new view", p.label);
  for (auto& lane : p.lanes) {
    for (auto& item : lane->sendQueue)
      if (item.request) completeLocked(item.request, ecclRemoteError, reason);
    // A goodbye first, so the leaver sees an orderly close and tells
    // nobody we failed.
    std::erase_if(lane->sendQueue, [](const SendItem& item) { return item.done == 0; });
    if (lane->conduit && lane->sendQueue.empty()) queueControlLocked(*lane, FrameType::kGoodbye, {});
    closeLaneLocked(*lane);
  }
  for (auto box = inbox_.begin(); box != inbox_.end();) {
    bool mine = box->first.peer == member;
    if (mine && box->second.request) completeLocked(box->second.request, ecclRemoteError, reason);
    box = mine ? inbox_.erase(box) : std::next(box);
  }
  discardOrphanedPayloadsLocked();
  peers_.erase(it);
}

void LaneDevice::beginEpoch(uint32_t epoch) {
  MutexLock lock(mu_);
  epoch_ = epoch;
  revokedCode_ = ecclSuccess;
  revokedReason_.clear();
  revokedFromSeq_ = 0;
  lastCheckedSeq_ = 0;
  signatures_.beginEpoch(epoch);
  for (auto box = inbox_.begin(); box != inbox_.end();) {
    bool stale = box->first.epoch < epoch;
    if (stale && box->second.request) completeLocked(box->second.request, ecclRemoteError, "superseded by a new view");
    box = stale ? inbox_.erase(box) : std::next(box);
  }
  discardOrphanedPayloadsLocked();
}

void LaneDevice::connectNow(MemberId member, Deadline deadline) {
  connectPeer(member);
  MutexLock lock(mu_);
  for (;;) {
    Peer& p = peerLocked(member);
    if (p.state == Peer::State::kUp) return;
    if (p.state == Peer::State::kFailed || p.state == Peer::State::kLeft)
      fail(p.failCode, "connecting to peer {}: {}", p.label, p.failReason);
    if (!cv_.waitUntil(mu_, deadline) && Clock::now() >= deadline) {
      // Every live member dials whatever it must (connectPeers goes on past
      // failures), so a view member still silent here is stopped or cut
      // off: like a wait's deadline, this declares it failed. A candidate's
      // silence only fails this call; the coordinator judges candidates.
      std::string why = fmt::format("peer {} did not connect before the deadline", p.label);
      if (p.role == PeerRole::kViewMember) failPeerLocked(member, ecclTimeout, why, true);
      fail(ecclTimeout, "{}", why);
    }
  }
}

void LaneDevice::progress() {
  MutexLock lock(mu_);
  if (callerOwned_) serviceLanesLocked();  // otherwise the progress thread is on it
}

bool LaneDevice::test(const RequestPtr& r, const std::string& opName) {
  int s = r->state.load();
  if (s == Request::kPending) return false;
  if (s == Request::kFailed) {
    MutexLock lock(mu_);
    throw Error(r->code, fmt::format("{}: {}", opName, r->error));
  }
  return true;
}

void LaneDevice::failPeerLocked(MemberId member, ecclResult_t code, const std::string& reason, bool flood) {
  auto it = peers_.find(member);
  if (it == peers_.end()) return;
  Peer& p = it->second;
  if (p.state == Peer::State::kFailed) return;
  bool wasLeft = p.state == Peer::State::kLeft;
  p.state = Peer::State::kFailed;
  p.failCode = code;
  p.failReason = reason;
  cv_.notifyAll();  // connectNow may be waiting for this peer to dial us
  log::warn("member {}: {}", opt_.self, reason);
  for (auto& lane : p.lanes) {
    for (auto& item : lane->sendQueue)
      if (item.request) completeLocked(item.request, code, reason);
    closeLaneLocked(*lane);
  }
  for (auto box = inbox_.begin(); box != inbox_.end();) {
    if (box->first.peer != member) {
      ++box;
      continue;
    }
    if (box->second.request) completeLocked(box->second.request, code, reason);
    box = inbox_.erase(box);
  }
  // Nothing is anyone's failure once we are closing ourselves. A peer that
  // left in order is nobody's failure either, until someone says otherwise:
  // a notice about it (the coordinator's, or a peer's that needed it) means
  // the view is broken, and ops waiting on others must end too.
  if (closing_ || (wasLeft && !flood)) return;
  if (p.role == PeerRole::kCandidate) {
    candidateFailed_.insert(member);
    cv_.notifyAll();
    return;  // not in the view: the coordinator decides what its loss means
  }
  if (onPeerFailure) onPeerFailure(member, code, reason);
  revokeLocked(code == ecclTimeout ? ecclTimeout : ecclRemoteError, reason);
  if (flood) floodNoticeLocked(member, reason);
}

// Tells everyone we are connected to, so ranks that wait on a live
// neighbour of the failed member learn its name at once.
void LaneDevice::floodNoticeLocked(MemberId member, const std::string& reason) {
  for (auto& [id, other] : peers_) {
    if (id == member || other.state == Peer::State::kFailed || other.lanes.empty() ||
        other.role == PeerRole::kCandidate)
      continue;
    Lane& lane = *other.lanes[0];
    if (!lane.conduit) continue;
    std::vector<uint8_t> payload(8 + reason.size());
    std::memcpy(payload.data(), &member, 8);
    std::memcpy(payload.data() + 8, reason.data(), reason.size());
    if (payload.size() > FrameHeader::kMaxControlPayload) payload.resize(FrameHeader::kMaxControlPayload);
    queueControlLocked(lane, FrameType::kNotice, std::move(payload));
  }
}

void LaneDevice::markLeftLocked(Peer& p) {
  // A lane the peer opened but we have not accepted yet still carries data.
  bool allSaid = std::all_of(p.lanes.begin(), p.lanes.end(),
                             [](auto& l) { return l->saidGoodbye || (l->opened && !l->conduit); });
  if (!allSaid || p.state == Peer::State::kFailed) return;
  std::string reason = fmt::format("peer {} has left (it destroyed its communicator)", p.label);
  for (auto& lane : p.lanes) {
    for (auto& item : lane->sendQueue)
      if (item.request) completeLocked(item.request, ecclRemoteError, reason);
    closeLaneLocked(*lane);
  }
  cv_.notifyAll();
  if (p.state == Peer::State::kLeft) return;
  p.state = Peer::State::kLeft;
  p.failCode = ecclRemoteError;
  p.failReason = reason;
  // Its goodbye followed its last data on every lane, so whole messages it
  // sent before leaving stay receivable; only what can never arrive fails.
  bool needed = false;
  for (auto box = inbox_.begin(); box != inbox_.end();) {
    bool lost = box->first.peer == p.id && box->second.received < box->second.total;
    if (lost && box->second.request) completeLocked(box->second.request, ecclRemoteError, reason), needed = true;
    box = lost ? inbox_.erase(box) : std::next(box);
  }
  if (needed) leftPeerNeededLocked(p);
}

// An op needed a member that left in order (mid-job, not at its end): the
// view is broken like after a failure, and everyone must hear it, or ranks
// waiting on us wait for the deadline.
void LaneDevice::leftPeerNeededLocked(Peer& p) {
  if (p.leftReported || closing_ || p.role == PeerRole::kCandidate) return;
  p.leftReported = true;
  if (onPeerFailure) onPeerFailure(p.id, ecclRemoteError, p.failReason);
  revokeLocked(ecclRemoteError, p.failReason);
  floodNoticeLocked(p.id, p.failReason);
}

void LaneDevice::queueControlLocked(Lane& lane, FrameType type, std::vector<uint8_t> payload) {
  SendItem item;
  FrameHeader h;
  h.type = type;
  h.epoch = epoch_;
  h.commId = opt_.commId;
  h.length = static_cast<uint32_t>(payload.size());
  encodeFrame(h, item.header);
  item.owned = std::move(payload);
  item.data = item.owned.data();
  item.length = item.owned.size();
  lane.sendQueue.push_back(std::move(item));
  // The deque keeps elements in place, so data keeps pointing at owned.
  flushLocked(lane);
}

void LaneDevice::abort(const std::string& reason) {
  MutexLock lock(mu_);
  if (aborted_) return;
  aborted_ = true;
  abortReason_ = reason;
  for (auto& [id, p] : peers_) {
    for (auto& lane : p.lanes) {
      for (auto& item : lane->sendQueue)
        if (item.request) completeLocked(item.request, ecclRemoteError, reason);
      closeLaneLocked(*lane);
    }
  }
  for (auto& [key, box] : inbox_)
    if (box.request) completeLocked(box.request, ecclRemoteError, reason);
  inbox_.clear();
  cv_.notifyAll();
}

void LaneDevice::close(Deadline deadline) {
  MutexLock lock(mu_);
  closing_ = true;
  for (auto& [id, p] : peers_)
    for (auto& lane : p.lanes)
      if (lane->conduit) queueControlLocked(*lane, FrameType::kGoodbye, {});
  for (;;) {
    bool pending = false;
    // Also wait for the peers' goodbyes: closing a socket with unread
    // incoming bytes sends a reset that can destroy data the peer has not
    // read yet.
    for (auto& [id, p] : peers_) {
      // Candidates (standbys) exchange no data; their goodbye is not awaited.
      if (p.state == Peer::State::kFailed || p.state == Peer::State::kLeft || p.role == PeerRole::kCandidate) continue;
      bool partlyConnected = std::any_of(p.lanes.begin(), p.lanes.end(), [](auto& l) { return l->opened; });
      for (auto& lane : p.lanes)
        pending = pending || (lane->conduit && (!lane->sendQueue.empty() || !lane->saidGoodbye)) ||
                  (!lane->opened && partlyConnected);
    }
    if (!pending || !cv_.waitUntil(mu_, std::min(deadline, Clock::now() + std::chrono::milliseconds(10))))
      if (!pending || Clock::now() >= deadline) break;
  }
}

void LaneDevice::progressLoop() {
  if (opt_.pinProgressThread) bindThreadNearNic(tcp_->interface().name);
  epoll_event events[2];
  int timeoutMs = 200;
  while (!stopping_) {
    int n = epoll_wait(epollFd_.get(), events, 2, timeoutMs);
    if (n < 0 && errno != EINTR) {
      log::warn("epoll_wait: {}", strerror(errno));
      continue;
    }
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 != kWakeToken) continue;
      uint64_t drained;
      [[maybe_unused]] ssize_t rc = ::read(eventFd_.get(), &drained, sizeof(drained));
    }
    MutexLock lock(mu_);
    // Take the lanes back once their lease has run out with nobody driving.
    if (callerOwned_ && drivers_ == 0 && Clock::now() >= leaseUntil_) setCallerOwnedLocked(false);
    timeoutMs = callerOwned_ ? kLeaseMs : 200;
    if (!callerOwned_) {
      serviceLanesLocked();
      if (!armLanesLocked()) timeoutMs = 0;
    }
  }
}

// Small frames arrive through the lane's receive buffer, several per
// recv(); a large payload is read straight into its destination. A short
// read means the socket is empty, so no recv() is spent on EAGAIN.
void LaneDevice::readLocked(Lane& lane) {
  const uint64_t token = lane.token;
  size_t budget = kReadBudgetPerEvent;
  bool drained = false;
  for (;;) {
    while (lane.rxBegin < lane.rxEnd) {
      size_t want;
      uint8_t* dst = rxDestinationLocked(lane, &want);
      size_t n = std::min(want, lane.rxEnd - lane.rxBegin);
      if (dst && n) std::memcpy(dst, lane.rxBuffer.get() + lane.rxBegin, n);
      lane.rxBegin += n;
      if (!advanceLocked(lane, n)) return;
    }
    lane.rxBegin = lane.rxEnd = 0;
    if (drained || budget == 0) return;
    size_t want;
    uint8_t* dst = rxDestinationLocked(lane, &want);
    const bool direct = lane.rx == Lane::Rx::kPayload && dst && want >= kDirectReadBytes;
    uint8_t* into = direct ? dst : lane.rxBuffer.get();
    const size_t ask = direct ? want : kRxBufferBytes;
    ssize_t rc = lane.conduit->read(into, ask);
    if (rc <= 0) {
      if (rc < 0 && (errno == EAGAIN || errno == EINTR)) return;
      MemberId remote = lane.key.remote;
      Peer& p = peers_[remote];
      // After our goodbye a peer closes its end instead of answering: orderly.
      if (lane.saidGoodbye || closing_) {
        closeLaneLocked(lane);
        markLeftLocked(p);
        return;
      }
      std::string why = rc == 0 ? "closed the connection" : fmt::format("connection error: {}", strerror(errno));
      failPeerLocked(remote, ecclRemoteError, fmt::format("peer {} {} (lane {})", p.label, why, lane.key.lane), true);
      return;
    }
    size_t got = static_cast<size_t>(rc);
    stats_.bytesReceived += got;
    budget -= std::min(budget, got);
    drained = got < ask;
    if (!direct) {
      lane.rxEnd = got;
    } else if (!advanceLocked(lane, got)) {
      return;
    }
    if (lane.token != token) return;
  }
}

// Where the next bytes of the current frame go (null: skipped) and how many
// it still needs.
uint8_t* LaneDevice::rxDestinationLocked(Lane& lane, size_t* want) {
  if (lane.rx == Lane::Rx::kHeader) {
    *want = FrameHeader::kSize - lane.headerGot;
    return lane.header + lane.headerGot;
  }
  if (lane.rx == Lane::Rx::kSignature) {
    *want = FrameHeader::kSignatureBytes - lane.signatureGot;
    return lane.signature + lane.signatureGot;
  }
  *want = lane.frame.length - lane.payloadGot;
  if (lane.frame.type != FrameType::kData) return lane.control.data() + lane.payloadGot;
  return lane.discarding ? nullptr : lane.target + lane.payloadGot;
}

// Accounts for `got` bytes of the current frame; false once the lane is
// closed or failed (its remaining bytes must not be looked at).
bool LaneDevice::advanceLocked(Lane& lane, size_t got) {
  const uint64_t token = lane.token;
  if (lane.rx == Lane::Rx::kHeader) {
    lane.headerGot += got;
    if (lane.headerGot < FrameHeader::kSize) return true;
    lane.headerGot = 0;
    if (!onHeaderLocked(lane)) return false;
    if (lane.rx == Lane::Rx::kSignature) return true;
  } else if (lane.rx == Lane::Rx::kSignature) {
    lane.signatureGot += got;
    if (lane.signatureGot < FrameHeader::kSignatureBytes) return true;
    if (!onSignatureLocked(lane)) return false;
  } else {
    lane.payloadGot += got;
  }
  if (lane.payloadGot < lane.frame.length) return true;
  lane.rx = Lane::Rx::kHeader;
  if (lane.frame.type == FrameType::kData)
    onPayloadDoneLocked(lane);
  else
    onControlLocked(lane);
  return lane.token == token;
}

bool LaneDevice::onHeaderLocked(Lane& lane) {
  std::string why;
  auto h = decodeFrame(lane.header, &why);
  MemberId remote = lane.key.remote;
  if (h && h->commId != opt_.commId)
    why = fmt::format("frame for communicator {:016x}, this is {:016x}", h->commId, opt_.commId), h.reset();
  if (!h) {
    stats_.framesRejected++;
    failPeerLocked(remote, ecclRemoteError,
                   fmt::format("peer {} sent a malformed frame on lane {} ({}); connection dropped",
                               labelLocked(remote), lane.key.lane, why),
                   true);
    return false;
  }
  lane.frame = *h;
  lane.target = nullptr;
  lane.discarding = true;
  lane.rx = Lane::Rx::kPayload;
  lane.payloadGot = 0;
  if (h->type != FrameType::kData) {
    lane.control.assign(h->length, 0);
    return true;
  }
  if (h->flags & FrameHeader::kCallSignature) {
    lane.rx = Lane::Rx::kSignature;
    lane.signatureGot = 0;
    return true;
  }
  return onDataFrameLocked(lane, nullptr);
}

bool LaneDevice::onSignatureLocked(Lane& lane) {
  lane.rx = Lane::Rx::kPayload;
  std::string why = "its checksum does not match";
  std::optional<CallSignature> sig;
  if (crc32c(lane.signature, FrameHeader::kSignatureBytes) == lane.frame.signatureCrc)
    sig = decodeSignature(lane.signature, &why);
  if (!sig) {
    stats_.framesRejected++;
    failPeerLocked(lane.key.remote, ecclRemoteError,
                   fmt::format("peer {} sent a malformed call signature on lane {} ({}); connection dropped",
                               labelLocked(lane.key.remote), lane.key.lane, why),
                   true);
    return false;
  }
  return onDataFrameLocked(lane, &*sig);
}

// Finds where a data frame's payload goes, once its header (and call
// signature) are in.
bool LaneDevice::onDataFrameLocked(Lane& lane, const CallSignature* signature) {
  const FrameHeader* h = &lane.frame;
  MemberId remote = lane.key.remote;
  if (h->epoch < epoch_) {
    stats_.staleFramesDropped++;
    log::trace("dropped a stale frame from {} (epoch {} < {})", labelLocked(remote), h->epoch, epoch_);
    return true;  // the payload is read and discarded
  }
  if (signature && FrameHeader::isCollective(h->seq)) {
    if (auto m = signatures_.remote(h->epoch, h->seq, remote, *signature)) {
      callMismatchLocked(remote, h->seq, m->mine, m->theirs);
      return true;  // discarded: the op is dead
    }
  }
  InboxKey key{h->epoch, remote, h->seq, h->tag};
  auto it = inbox_.find(key);
  if (it == inbox_.end()) {
    Inbox& box = inbox_[key];
    box.unexpected = true;
    box.total = h->total;
    try {
      takeStagingLocked(box, h->total);
    } catch (const std::bad_alloc&) {
      inbox_.erase(key);
      failPeerLocked(remote, ecclSystemError,
                     fmt::format("peer {} sent an unexpected message of {} bytes that cannot be staged",
                                 labelLocked(remote), h->total),
                     true);
      return false;
    }
    it = inbox_.find(key);
  }
  Inbox& box = it->second;
  if (signature && !FrameHeader::isCollective(h->seq) && !FrameHeader::survivesRevocation(h->seq)) {
    box.sent = *signature;
    if (box.request && box.expected && !signaturesAgree(*box.expected, *signature)) {
      callMismatchLocked(remote, h->seq, *box.expected, *signature);
      return true;  // the revocation failed and dropped the receive
    }
  }
  if (box.total != h->total) {
    // The sender's message size disagrees with the posted receive: fail the
    // receive, discard this message, keep the connection.
    if (box.request)
      completeLocked(box.request, ecclInvalidUsage,
                     fmt::format("peer {} sent {} bytes where {} were expected (mismatched counts or types)",
                                 labelLocked(remote), h->total, box.total));
    inbox_.erase(it);
    return true;
  }
  if (h->flags & FrameHeader::kPayloadChecksum) box.checksummed = true, box.crc = h->payloadCrc;
  lane.inboxKey = key;
  lane.target = box.base() + h->offset;
  lane.discarding = false;
  return true;
}

// Staging buffers are reused: a fresh one per early message would cost a
// page fault per 4 KiB on every large op whose peer started first.
void LaneDevice::takeStagingLocked(Inbox& box, size_t bytes) {
  auto best = stagingPool_.end();
  for (auto it = stagingPool_.begin(); it != stagingPool_.end(); ++it)
    if (it->second >= bytes && (best == stagingPool_.end() || it->second < best->second)) best = it;
  if (best != stagingPool_.end()) {
    box.staged = std::move(best->first);
    box.stagedCapacity = best->second;
    stagingPoolBytes_ -= best->second;
    stagingPool_.erase(best);
    return;
  }
  box.staged.reset(new uint8_t[std::max<size_t>(bytes, 1)]);
  box.stagedCapacity = bytes;
}

void LaneDevice::recycleStagingLocked(Inbox& box) {
  constexpr size_t kPoolLimitBytes = size_t(256) << 20;
  if (!box.staged || stagingPoolBytes_ + box.stagedCapacity > kPoolLimitBytes) return;
  stagingPoolBytes_ += box.stagedCapacity;
  stagingPool_.emplace_back(std::move(box.staged), box.stagedCapacity);
  box.stagedCapacity = 0;
}

// A message whose sender attached a CRC32C is verified once whole; a
// mismatch fails that receive only (the connection and the view stay).
bool LaneDevice::checksumHoldsLocked(Inbox& box, const std::string& peerLabel) {
  if (!box.checksummed) return true;
  uint32_t got = crc32c(box.base(), box.total);
  if (got == box.crc) return true;
  completeLocked(box.request, ecclRemoteError,
                 fmt::format("the {}-byte message from peer {} failed its checksum (CRC32C {:08x} expected, the data "
                             "has {:08x}): a corrupted record",
                             box.total, peerLabel, box.crc, got));
  return false;
}

void LaneDevice::onPayloadDoneLocked(Lane& lane) {
  if (lane.discarding) return;
  auto it = inbox_.find(lane.inboxKey);
  if (it == inbox_.end()) return;
  Inbox& box = it->second;
  box.received += lane.frame.length;
  if (box.received < box.total || !box.request) return;
  if (!checksumHoldsLocked(box, labelLocked(lane.key.remote))) {
    inbox_.erase(it);
    return;
  }
  if (box.unexpected && box.total) std::memcpy(box.userBuffer, box.staged.get(), box.total);
  recycleStagingLocked(box);
  completeLocked(box.request, ecclSuccess, {});
  inbox_.erase(it);
}

void LaneDevice::onControlLocked(Lane& lane) {
  MemberId remote = lane.key.remote;
  Peer& p = peers_[remote];
  if (lane.frame.type == FrameType::kGoodbye) {
    lane.saidGoodbye = true;
    markLeftLocked(p);
    return;
  }
  if (lane.frame.type == FrameType::kPing) {
    answerPingLocked(lane);
    return;
  }
  if (lane.frame.type == FrameType::kPong) {
    p.lastPong = Clock::now();
    onPongSignatureLocked(lane);
    cv_.notifyAll();
    return;
  }
  if (lane.frame.type == FrameType::kRevoke) {
    uint64_t fromSeq;
    uint32_t code;
    std::memcpy(&fromSeq, lane.control.data(), 8);
    std::memcpy(&code, lane.control.data() + 8, 4);
    std::string reason(reinterpret_cast<char*>(lane.control.data()) + 12, lane.control.size() - 12);
    if (lane.frame.epoch != epoch_ || revokedCode_ != ecclSuccess) return;  // another view's, or known
    auto result = code > ecclSuccess && code < ecclNumResults ? static_cast<ecclResult_t>(code) : ecclRemoteError;
    std::string why = fmt::format("{} (heard from {})", reason, p.label);
    revokeLocked(result, why, fromSeq);
    floodRevokeLocked(result, reason, fromSeq);
    if (onRevoked) onRevoked(result, why);
    return;
  }
  MemberId failed;
  std::memcpy(&failed, lane.control.data(), 8);
  std::string reason(reinterpret_cast<char*>(lane.control.data()) + 8, lane.control.size() - 8);
  if (failed == opt_.self) {
    log::warn("peer {} reports this member failed: {}", p.label, reason);
    return;
  }
  auto it = peers_.find(failed);
  if (it == peers_.end() || it->second.state == Peer::State::kFailed) return;
  failPeerLocked(failed, ecclRemoteError,
                 fmt::format("peer {} failed (reported by {}: {})", it->second.label, p.label, reason), true);
}

// Accepts and authenticates lanes on every back end's listener. One that
// comes from a member this device does not know yet (it read the address
// table before we did) is parked rather than waited for here, so the lanes
// behind it are accepted meanwhile; addPeer installs it, or it is dropped
// at its deadline.
void LaneDevice::acceptLoop() {
  std::vector<Backend*> listening{tcp_.get()};
  if (shm_) listening.push_back(shm_.get());
  while (!stopping_) {
    pollfd fds[2];
    for (size_t i = 0; i < listening.size(); ++i) fds[i] = {listening[i]->listenFd(), POLLIN, 0};
    int ready = ::poll(fds, static_cast<nfds_t>(listening.size()), 100);
    {
      MutexLock lock(mu_);
      dropExpiredParkedLocked();
    }
    for (size_t i = 0; ready > 0 && i < listening.size(); ++i)
      if (fds[i].revents & POLLIN) acceptOne(*listening[i]);
  }
}

void LaneDevice::acceptOne(Backend& backend) {
  std::string from;
  Fd stream = backend.accept(&from);
  if (!stream) return;
  std::string what = fmt::format("member {}: incoming {} connection from {}", opt_.self, backend.name(), from);
  try {
    Deadline deadline = deadlineAfterMs(opt_.handshakeTimeoutMs);
    membership::Hello hello =
        membership::authenticateAsServer(stream.get(), opt_.secret, opt_.jobId, deadline, what);
    if (hello.purpose != membership::Purpose::kData || hello.toMember != opt_.self)
      fail(ecclAuthError, "{}: hello is for member {}, purpose {}", what, hello.toMember,
           static_cast<int>(hello.purpose));
    if (opt_.transport == TransportChoice::kShm && &backend != shm_.get())
      fail(ecclInvalidUsage, "{}: ECCL_TRANSPORT=shm here, but member {} dialed over {}", what, hello.fromMember,
           backend.name());
    auto conduit = backend.openAccepted(std::move(stream), deadline, what);
    MutexLock lock(mu_);
    if (!peers_.count(hello.fromMember)) {
      parked_.push_back({hello.fromMember, hello.lane, &backend, std::move(conduit), deadline, what});
      return;
    }
    acceptLaneLocked(hello.fromMember, hello.lane, &backend, std::move(conduit), what);
  } catch (const std::exception& e) {
    MutexLock lock(mu_);
    stats_.connectionsRejected++;
    log::warn("rejected {}", e.what());
  }
}

void LaneDevice::acceptLaneLocked(MemberId from, uint32_t laneIndex, Backend* backend,
                                  std::unique_ptr<Conduit> conduit, const std::string& what) {
  Peer& p = peers_.at(from);
  if (laneIndex >= p.lanes.size() || p.lanes[laneIndex]->opened || p.state == Peer::State::kFailed ||
      p.state == Peer::State::kLeft || from >= opt_.self)
    fail(ecclAuthError, "{}: unexpected lane {} from member {}", what, laneIndex, from);
  if (p.backend && p.backend != backend)
    fail(ecclAuthError, "{}: lane {} from member {} came over {}, its other lanes over {}", what, laneIndex, from,
         backend->name(), p.backend->name());
  p.backend = backend;
  installLaneLocked(p, laneIndex, std::move(conduit));
}

void LaneDevice::installParkedLocked(MemberId member) {
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (it->from != member) {
      ++it;
      continue;
    }
    try {
      acceptLaneLocked(it->from, it->lane, it->backend, std::move(it->conduit), it->what);
    } catch (const Error& e) {
      stats_.connectionsRejected++;
      log::warn("rejected {}", e.what());
    }
    it = parked_.erase(it);
  }
}

void LaneDevice::dropExpiredParkedLocked() {
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (!stopping_ && Clock::now() < it->deadline) {
      ++it;
      continue;
    }
    stats_.connectionsRejected++;
    log::warn("rejected {}: member {} is not a member of this communicator", it->what, it->from);
    it = parked_.erase(it);
  }
}

}  // namespace

std::unique_ptr<Device> createDevice(const DeviceOptions& options) {
  return std::make_unique<LaneDevice>(options);
}

}  // namespace eccl::transport
