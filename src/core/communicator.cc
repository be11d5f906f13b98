#include "core/communicator.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>

#include "membership/coord_client.h"
#include "membership/coordinator.h"
#include "common/crypto.h"
#include "transport/connect.h"
#include "elastic/delta.h"
#include "membership/unique_id.h"
#include "coll/algorithms.h"
#include "coll/reduce.h"
#include "common/copy.h"
#include "common/error.h"
#include "common/log.h"
#include "common/params.h"
#include "transport/frame.h"
#include "transport/backend.h"
#include "transport/device.h"

namespace eccl {

using coll::typeSize;

// Binds one op's sequence number and label to the links an algorithm uses.
class Communicator::OpLinks final : public coll::Links {
 public:
  OpLinks(Communicator& c, uint64_t seq, const char* name, const transport::CallSignature* signature)
      : comm_(c), seq_(seq), name_(name), signature_(signature), deadline_(deadlineAfterMs(c.timeoutMs_)) {}
  // Called only inside runCollective, which holds the role.
  int rank() const override ECCL_REQUIRES(comm_.caller_) { return comm_.rank_; }
  int size() const override ECCL_REQUIRES(comm_.caller_) { return comm_.size(); }
  transport::RequestPtr isend(int peer, uint32_t tag, const void* buf, size_t bytes) override ECCL_REQUIRES(comm_.caller_) {
    const transport::MemberId member = comm_.view_.rankToMember[peer];
    if (transport::FastChannel* slots = comm_.fast_->route(member, bytes))
      return comm_.fast_->send(slots, member, peer, tag, buf, bytes);
    return comm_.device_->isend(member, seq_, tag, buf, bytes, nullptr, signature_);
  }
  transport::RequestPtr irecv(int peer, uint32_t tag, void* buf, size_t bytes) override ECCL_REQUIRES(comm_.caller_) {
    const transport::MemberId member = comm_.view_.rankToMember[peer];
    if (transport::FastChannel* slots = comm_.fast_->route(member, bytes))
      return comm_.fast_->recv(slots, member, peer, tag, buf, bytes);
    return comm_.device_->irecv(member, seq_, tag, buf, bytes, signature_);
  }
  // The op's label is formatted only when a wait fails: small ops are a
  // few microseconds and a string per op shows up in their profile.
  void wait(const transport::RequestPtr& r) override ECCL_REQUIRES(comm_.caller_) {
    try {
      if (FastPath::owns(r))
        comm_.fast_->wait(r);
      else
        comm_.device_->wait(r, deadline_, {});
    } catch (const Error& e) {
      throw labelled(e);
    }
  }
  void exchange(int peer, uint32_t tag, const void* from, size_t sendBytes, void* into, size_t recvBytes) override
      ECCL_REQUIRES(comm_.caller_) {
    if (!overSlots(peer, tag, from, sendBytes, into, recvBytes, nullptr))
      coll::Links::exchange(peer, tag, from, sendBytes, into, recvBytes);
  }
  void exchangeAndUse(int peer, uint32_t tag, const void* from, size_t sendBytes, uint8_t* scratch,
                      size_t recvBytes, FunctionRef<void(const uint8_t*)> use) override ECCL_REQUIRES(comm_.caller_) {
    if (!overSlots(peer, tag, from, sendBytes, scratch, recvBytes, &use))
      coll::Links::exchangeAndUse(peer, tag, from, sendBytes, scratch, recvBytes, use);
  }
  // Asked only where every rank is on this host (readDirectly).
  bool readsEveryPeer() override ECCL_REQUIRES(comm_.caller_) {
    for (int peer = 0; peer < comm_.size(); ++peer)
      if (peer != comm_.rank_ && !comm_.fast_->peerMemory(comm_.view_.rankToMember[peer])) return false;
    return true;
  }
  void readPeer(int peer, uint64_t address, void* into, size_t bytes) override ECCL_REQUIRES(comm_.caller_) {
    const transport::MemberId member = comm_.view_.rankToMember[peer];
    const transport::PeerMemory* memory = comm_.fast_->peerMemory(member);
    std::string why = "its lane offers no way to read its memory";
    comm_.device_->foregroundBeside(member);
    if (memory && memory->read(address, into, bytes, &why)) {
      comm_.peerBytesRead_.fetch_add(bytes, std::memory_order_relaxed);
      return;
    }
    // The peer holds itself in the op while it is read: a read that fails
    // means it died or broke off, and it is failed as a lost connection
    // would fail it (every rank hears, the async error is set).
    if (memory)
      comm_.device_->failPeer(member, ecclRemoteError, fmt::format("reading rank {}'s buffer: {}", peer, why), seq_);
    if (auto known = comm_.device_->whyOpFails(member, seq_, false))
      throw Error(known->first, fmt::format("{}: {}", comm_.opLabel(name_, seq_), known->second));
    throw Error(ecclRemoteError, fmt::format("{}: reading rank {}'s buffer: {}", comm_.opLabel(name_, seq_), peer, why));
  }
  size_t segmentBytes() const override { return comm_.segmentBytes_; }
  Deadline deadline() const { return deadline_; }
  uint8_t* scratch(int slot, size_t bytes) override ECCL_REQUIRES(comm_.caller_) { return comm_.scratch(slot, bytes); }

 private:
  // An exchange through the peer's slots; false where its messages take the device.
  bool overSlots(int peer, uint32_t tag, const void* from, size_t sendBytes, void* into, size_t recvBytes,
                 const FunctionRef<void(const uint8_t*)>* use) ECCL_REQUIRES(comm_.caller_) {
    const transport::MemberId member = comm_.view_.rankToMember[peer];
    transport::FastChannel* slots = comm_.fast_->route(member, std::max(sendBytes, recvBytes));
    if (!slots) return false;
    try {
      comm_.fast_->exchange(slots, member, peer, tag, from, sendBytes, into, recvBytes, use);
    } catch (const Error& e) {
      throw labelled(e);
    }
    return true;
  }
  Error labelled(const Error& e) const ECCL_REQUIRES(comm_.caller_) {
    return Error(e.code(), fmt::format("{}: {}", comm_.opLabel(name_, seq_), e.what()));
  }

  Communicator& comm_;
  uint64_t seq_;
  const char* name_;
  const transport::CallSignature* signature_;
  Deadline deadline_;
};

Communicator::Communicator(int nranks, const ecclUniqueId& id, int rank, const CommOptions& o)
    : timeoutMs_(o.timeoutMs > 0 ? o.timeoutMs : params::timeoutMs()) {
  CallerTurn turn(caller_);  // nobody else can reach this object yet
  ECCL_CHECK_ARG(nranks >= 1, "ecclCommInitRank: nranks={} must be at least 1", nranks);
  ECCL_CHECK_ARG(rank >= 0 && rank < nranks, "ecclCommInitRank: rank {} is outside [0, {})", rank, nranks);
  join(id, membership::Role::kRank, rank, nranks, o);
  membership::ViewUpdate first;
  try {
    first = client_->awaitView(deadlineAfterMs(timeoutMs_), fmt::format("bootstrap of rank {}", rank));
  } catch (const Error& e) {
    if (e.code() != ecclTimeout) throw;
    // Say who is missing: the coordinator knows.
    std::string status;
    try {
      status = membership::queryCoordinatorStatus(membership::decodeUniqueId(id), deadlineAfterMs(1000));
    } catch (const Error&) {
    }
    fail(ecclTimeout, "{}{}{}", e.what(), status.empty() ? "" : "; coordinator: ", status.substr(0, status.find('\n')));
  }
  enterViewAtInit(first);
  log::info("rank {} of {} ready at {} (epoch {})", rank_, size(), transport::displayAddress(device_->address()),
            view_.epoch);
}

Communicator::Communicator(const ecclUniqueId& id, const CommOptions& o, int64_t promotionTimeoutMs, bool wait)
    : timeoutMs_(o.timeoutMs > 0 ? o.timeoutMs : params::timeoutMs()) {
  CallerTurn turn(caller_);  // nobody else can reach this object yet
  eager_ = params::prepareEager();
  standby_ = true;
  startedAsStandby_ = true;
  join(id, membership::Role::kStandby, -1, 0, o);
  if (wait) awaitPromotion(deadlineAfterMs(promotionTimeoutMs > 0 ? promotionTimeoutMs : params::standbyTimeoutMs()));
}

void Communicator::join(const ecclUniqueId& id, membership::Role role, int rank, int nranks, const CommOptions& o) {
  membership::UniqueIdData idData = membership::decodeUniqueId(id);
  do randomBytes(&self_, sizeof(self_));
  while (self_ == 0);
  transport::DeviceOptions t;
  t.self = self_;
  t.jobId = idData.jobId;
  t.commId = idData.jobId;
  t.secret = idData.secret;
  t.lanes = o.socketsPerPeer > 0 ? o.socketsPerPeer : params::socketsPerPeer();
  ECCL_CHECK_ARG(t.lanes >= 1 && t.lanes <= 64, "sockets per peer must be in [1, 64], got {}", t.lanes);
  t.stripeMinBytes = params::stripeMinBytes();
  t.handshakeTimeoutMs = std::min<int64_t>(params::handshakeTimeoutMs(), timeoutMs_);
  t.ifname = params::socketIfname();
  t.pinProgressThread = params::pinProgressThread() != 0;
  t.copyHelpBytes = params::copyHelpBytes();
  t.shmUnlockedWrites = params::shmUnlockedWrites();
  t.spinUs = std::max<int64_t>(0, params::spinUs());
  t.rdmaPollUs = std::max<int64_t>(0, params::ibPollUs());
  t.announceReceives = params::ibAnnounceReceives() != 0;
  if (std::string choice = params::transport(); choice != "auto") t.backends = transport::parseBackendList(choice);
  t.ringBytes = static_cast<size_t>(params::shmRingBytes());
  t.shmZeroCopyBytes = static_cast<size_t>(std::max<int64_t>(0, params::shmZeroCopyBytes()));
  t.shmPeerReads = params::shmPeerReads() != 0;
  device_ = transport::createDevice(t);
  fast_ = std::make_unique<FastPath>(*device_, static_cast<size_t>(std::max<int64_t>(0, params::shmFastPathBytes())),
                                     t.spinUs, timeoutMs_);
  device_->onPeerFailure = [this](transport::MemberId m, ecclResult_t code, const std::string& reason,
                                  uint64_t neededFrom, transport::FailureEvidence evidence) {
    onPeerFailure(m, code, reason, neededFrom, evidence);
  };
  device_->onRevoked = [this](ecclResult_t code, const std::string& reason) { onRevoked(code, reason); };
  worker_ = std::make_unique<BackgroundWorker>();
  if (role == membership::Role::kStandby && eager_)
    feed_ = std::make_unique<sandbox::Feed>(*device_, static_cast<size_t>(std::max<int64_t>(0, params::sandboxRecordBytes())));
  membership::JoinRequest req{role, rank, nranks, self_, device_->address(), eager_};
  req.failoverMs = params::coordFailoverMs();
  client_ = std::make_unique<membership::CoordClient>(idData, req, params::heartbeatMs(), params::heartbeatTimeoutMs(),
                                                     deadlineAfterMs(timeoutMs_));
  {
    MutexLock lock(reporterMu_);
    reporter_ = client_.get();
  }
  elastic::MigrationLinks links;
  links.device = device_.get();
  links.client = client_.get();
  links.worker = worker_.get();
  links.timeoutMs = timeoutMs_;
  links.report = [this](transport::MemberId m, const std::string& why) {
    MutexLock lock(reporterMu_);
    if (reporter_) reporter_->report(m, why);
  };
  links.prepared = [this](uint32_t epoch) {
    MutexLock lock(reporterMu_);
    if (reporter_) reporter_->prepared(epoch);
  };
  links.readsEveryPeer = [this](const std::vector<transport::MemberId>& members) {
    return viewReadsEveryPeer(members);
  };
  migration_ = std::make_unique<elastic::Migration>(std::move(links));
  client_->setCallbacks({
      [this](const membership::CoordMessage& f) {
        // Sequence numbers are per epoch: another epoch's mean every op.
        bool sameEpoch = f.epoch == currentEpoch_.load();
        for (size_t i = 0; i < f.members.size(); ++i)
          if (f.members[i] != self_)
            device_->failPeer(f.members[i], ecclRemoteError, f.text, sameEpoch ? f.neededFromOf(i) : 0);
      },
      [this](const std::string& reason) {
        {
          MutexLock lock(errorMu_);
          asyncError_ = ecclEvicted;
          asyncMessage_ = fmt::format("this member was evicted from the job: {}", reason);
        }
        device_->abort(fmt::format("evicted: {}", reason));
      },
      [this](const membership::CoordMessage& m) { onReconfiguration(m); },
      [this](const std::vector<membership::ViewEntry>& entries) {
        if (!eager_) return;
        if (feed_) {
          std::vector<transport::MemberId> members;
          for (const auto& e : entries) members.push_back(e.member);
          feed_->setMembers(members);
        }
        worker_->post([this, entries] { migration_->connectStandbys(entries); });
      },
      nullptr,  // a communicator watches no groups
  });
}

// A process at init holds its rank once the coordinator has put it in a
// view; a member of that view that died or hung meanwhile is a failure of
// the view, recovered like any other, not of this process's init (exiting
// here would turn one failure into two, and a REPLACE short of standbys).
// The communicator is returned revoked: its first op and
// ecclCommGetAsyncError report the failure, and ecclCommRecover goes on.
void Communicator::enterViewAtInit(const membership::ViewUpdate& v) {
  try {
    applyView(v);
  } catch (const Error& e) {
    if (e.code() != ecclRemoteError && e.code() != ecclTimeout && e.code() != ecclAuthError) throw;
    log::warn("rank {} holds its rank at epoch {}, but its view is already broken: {}", v.rank, v.epoch, e.what());
  }
}

// Makes `v` the current view: leavers' connections close, joiners are added,
// ops of the old epoch die, and everything else is inherited untouched. The
// peers of the ring and latency algorithms are connected before returning
// so the first collective pays no connection setup.
void Communicator::applyView(const membership::ViewUpdate& v) {
  auto start = Clock::now();
  transport::DeviceStats before = device_->stats();
  std::vector<transport::MemberId> next;
  for (const auto& e : v.entries) next.push_back(e.member);
  elastic::DeltaPlan plan = elastic::planDelta(view_.rankToMember, next, self_, v.rank);
  for (transport::MemberId m : plan.close) device_->removePeer(m);
  transport::DeviceStats afterClose = device_->stats();
  for (size_t r = 0; r < v.entries.size(); ++r)
    if (v.entries[r].member != self_)
      device_->addPeer(v.entries[r].member, v.entries[r].address,
                       fmt::format("rank {} ({})", r, transport::displayAddress(v.entries[r].address)));
  device_->beginEpoch(v.epoch);
  device_->setLabel(fmt::format("rank {} ({})", v.rank, transport::displayAddress(device_->address())));
  sendLog_.renumber(view_.rankToMember, next);
  view_.epoch = v.epoch;
  currentEpoch_ = v.epoch;
  view_.rankToMember = next;
  rank_ = v.rank;
  migration_->setRank(v.rank);
  lastWhy_ = v.why;
  collSeq_ = 0;
  sendSeq_.assign(next.size(), 0);
  recvSeq_.assign(next.size(), 0);
  selfSends_.clear();
  selfRecvIndex_ = 0;
  {
    MutexLock lock(errorMu_);
    if (asyncError_ != ecclEvicted && !callMismatch_) asyncError_ = ecclSuccess, asyncMessage_.clear();
  }
  try {
    transport::connectAll(*device_, plan.connect, deadlineAfterMs(timeoutMs_));
  } catch (const Error& e) {
    // A member of the new view is gone already (it died after its vote):
    // the view stands, revoked, and the caller recovers from it. This
    // member may have seen the death while the peer was only a candidate
    // (nobody's failure then), so it reports it now: the coordinator must
    // know before this member's recovery request arrives.
    for (size_t r = 0; r < next.size(); ++r)
      if (next[r] != self_ && !device_->hasPeer(next[r])) {
        MutexLock lock(reporterMu_);
        if (reporter_) reporter_->report(next[r], fmt::format("rank {} of epoch {} was gone when this member entered it: {}",
                                                              r, v.epoch, e.what()));
      }
    MutexLock lock(errorMu_);
    if (asyncError_ == ecclSuccess) {
      asyncError_ = e.code() == ecclTimeout ? ecclTimeout : ecclRemoteError;
      asyncMessage_ = fmt::format("communicator revoked at epoch {}: {}", v.epoch, e.what());
    }
    throw;
  }
  transport::DeviceStats after = device_->stats();
  reconfig_.connectionsClosed = afterClose.connectionsClosed - before.connectionsClosed;
  reconfig_.connectionsOpened = after.connectionsOpened - afterClose.connectionsOpened;
  reconfig_.connectionsInherited = afterClose.openConnections;
  reconfig_.queuePairsOpened = after.queuePairsOpened - afterClose.queuePairsOpened;
  reconfig_.queuePairsClosed = afterClose.queuePairsClosed - before.queuePairsClosed;
  reconfig_.applyMs = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

void Communicator::recover(ecclRecoverPolicy_t policy) {
  ECCL_CHECK_ARG(policy >= ecclRecoverReplace && policy <= ecclRecoverReplaceOrShrink,
                 "ecclCommRecover: invalid policy {}", static_cast<int>(policy));
  {
    MutexLock lock(errorMu_);
    if (asyncError_ == ecclEvicted) throw Error(ecclEvicted, asyncMessage_);
    if (callMismatch_)
      fail(ecclInvalidUsage, "ecclCommRecover (rank {}): the ranks disagreed about a call, which no view change mends; "
           "destroy the communicator ({})", rank_, asyncMessage_);
  }
  migration_->abstain();  // a switchover this member will not make must not keep the others voting
  auto start = Clock::now();
  client_->requestRecover(view_.epoch, static_cast<uint32_t>(policy));
  membership::ViewUpdate v = client_->awaitView(deadlineAfterMs(timeoutMs_), fmt::format("ecclCommRecover (rank {})", rank_));
  auto agreed = Clock::now();
  uint32_t oldEpoch = view_.epoch;
  if (v.epoch == oldEpoch) {
    // Nobody failed and this member saw no failure (the caller's error was
    // its own): the peers' calls go on in this epoch, so this member's
    // sequence must not start over, or its next call waits for theirs.
    MutexLock lock(errorMu_);
    if (asyncError_ == ecclSuccess) {
      log::info("ecclCommRecover (rank {}): nothing failed; epoch {} goes on", rank_, oldEpoch);
      return;
    }
  }
  migration_->reset();  // a preparation the failure aborted is over
  // A member of the new view may be gone already: the view stands, revoked,
  // and the error tells the caller to recover again from it.
  applyView(v);
  reconfig_.prepared = {};
  finishReconfiguration(start, agreed, oldEpoch, "recovered");
}

void Communicator::fillStats(ecclCommStats_t* out) const {
  ecclCommStats_t s{};
  s.size = out->size;
  s.epoch = view_.epoch;
  s.rank = rank_;
  s.nranks = size();
  s.joinedEpoch = joinedEpoch_;
  s.reconfigurations = reconfigurations_;
  s.connectionsOpened = reconfig_.connectionsOpened;
  s.connectionsClosed = reconfig_.connectionsClosed;
  s.connectionsInherited = reconfig_.connectionsInherited;
  s.agreeMs = reconfig_.agreeMs;
  s.applyMs = reconfig_.applyMs;
  s.totalMs = reconfig_.totalMs;
  s.connectionsPrepared = reconfig_.prepared.connections;
  s.prepareMs = reconfig_.prepared.ms;
  s.queuePairsOpened = reconfig_.queuePairsOpened;
  s.queuePairsClosed = reconfig_.queuePairsClosed;
  s.queuePairsPrepared = reconfig_.prepared.queuePairs;
  transport::DeviceStats d = device_->stats();
  s.openConnections = d.openConnections;
  s.staleFramesDropped = d.staleFramesDropped;
  s.queuePairsOpen = d.queuePairsCreated - d.queuePairsDestroyed;
  s.sandboxCalls = sandboxOps_;
  s.sandboxReplayed = sandboxReplayed_;
  s.sandboxRecordingsReceived = feed_ ? feed_->received() : 0;
  s.sandboxRecordingsShipped = recordingsShipped_.load();
  const FastPath::Counters fast = fast_->counters();
  s.fastMessagesSent = fast.sent;
  s.fastMessagesReceived = fast.received;
  s.fastMessagesStale = fast.staleDropped;
  s.bytesReadUnlocked = d.bytesReadUnlocked;
  s.bytesCopiedByHelper = d.bytesCopiedByHelper;
  s.zeroCopyBytesUnlocked = d.zeroCopyBytesUnlocked;
  s.directCollectives = directCollectives_.load(std::memory_order_relaxed);
  s.peerBytesRead = peerBytesRead_.load(std::memory_order_relaxed);
  s.peerReadLanes = d.peerReadLanes;
  s.connectionsOpenedEver = d.connectionsOpened;
  s.stagedBytesCopiedUnlocked = d.stagedBytesCopiedUnlocked;
  std::memcpy(out, &s, std::min(out->size, sizeof(s)));
}

// The device's threads report failures into this object, so they must stop
// before any member they touch is destroyed; the coordinator client goes
// first so nothing calls into a dying device.
Communicator::~Communicator() {
  {
    MutexLock lock(reporterMu_);
    reporter_ = nullptr;
  }
  client_.reset();
  feed_.reset();
  worker_.reset();
  migration_.reset();
  device_.reset();
}

void Communicator::onReconfiguration(const membership::CoordMessage& m) {
  if (m.kind == membership::CoordKind::kStandbys) {
    worker_->post([this, list = m.entries] {
      migration_->connectStandbys(list);
      eagerStandbys_.clear();
      for (const auto& e : list) eagerStandbys_.push_back(e.member);
    });
    return;
  }
  migration_->onAnnouncement(m);
}

void Communicator::onPeerFailure(transport::MemberId member, ecclResult_t code, const std::string& reason,
                                 uint64_t neededFrom, transport::FailureEvidence evidence) {
  {
    MutexLock lock(reporterMu_);
    if (reporter_)
      reporter_->report(member, reason, neededFrom, currentEpoch_.load(),
                        evidence == transport::FailureEvidence::kPeerClosed);
  }
  MutexLock lock(errorMu_);
  if (asyncError_ != ecclSuccess) return;
  asyncError_ = code == ecclTimeout ? ecclTimeout : ecclRemoteError;
  asyncMessage_ = fmt::format("communicator revoked at epoch {}: {}", currentEpoch_.load(), reason);
}

void Communicator::onRevoked(ecclResult_t code, const std::string& reason) {
  MutexLock lock(errorMu_);
  if (code == ecclInvalidUsage) callMismatch_ = true;
  if (asyncError_ != ecclSuccess) return;
  asyncError_ = code;
  asyncMessage_ = fmt::format("communicator revoked at epoch {}: {}", currentEpoch_.load(), reason);
}

void Communicator::recordAsyncError(ecclResult_t code, const std::string& message) {
  MutexLock lock(errorMu_);
  if (asyncError_ != ecclSuccess) return;
  asyncError_ = code;
  asyncMessage_ = message;
}

ecclResult_t Communicator::asyncError() const {
  MutexLock lock(errorMu_);
  return asyncError_;
}

std::string Communicator::asyncErrorMessage() const {
  MutexLock lock(errorMu_);
  return asyncMessage_;
}

void Communicator::checkUsable() const {
  if (standby_)
    fail(ecclInvalidUsage, "this standby (member {:016x}) has no rank yet: it is waiting to be promoted", self_);
  if (joining_)
    fail(ecclInvalidUsage, "rank {} is joining at epoch {}: call ecclCommSwitchover before any collective", rank_,
         view_.epoch + 1);
  if (asyncErrorWithoutLock() == ecclSuccess) return;
  MutexLock lock(errorMu_);
  if (asyncError_ != ecclSuccess) throw Error(asyncError_, asyncMessage_);
}

void Communicator::setLastError(std::string message) {
  MutexLock lock(errorMu_);
  lastError_ = std::move(message);
}

const char* Communicator::lastError() const {
  MutexLock lock(errorMu_);
  return lastError_.c_str();
}

uint8_t* Communicator::scratch(int slot, size_t bytes) {
  if (slot >= static_cast<int>(scratch_.size())) scratch_.resize(slot + 1);
  Scratch& s = scratch_[slot];
  if (s.bytes < bytes) {
    s.data.reset(new uint8_t[bytes]);  // uninitialised on purpose
    s.bytes = bytes;
  }
  return s.data.get();
}

void Communicator::pushSelfSend(const void* buf, size_t bytes) { selfSends_.emplace_back(buf, bytes); }

void Communicator::popSelfRecv(void* buf, size_t bytes) {
  if (selfRecvIndex_ >= selfSends_.size())
    fail(ecclInvalidUsage, "recv from self (rank {}) has no matching send to self in the group", rank_);
  auto [src, n] = selfSends_[selfRecvIndex_++];
  if (selfRecvIndex_ == selfSends_.size()) selfSends_.clear(), selfRecvIndex_ = 0;
  if (n != bytes)
    fail(ecclInvalidUsage, "send to self of {} bytes matched a recv of {} bytes (rank {})", n, bytes, rank_);
  if (n) moveBytes(buf, src, n);
}

// Any thread: the rank is the caller's state, the member id is not.
void Communicator::abort() {
  device_->abort(fmt::format("member {:016x}: communicator aborted by the application", self_));
}

void Communicator::destroy() {
  if (feed_) feed_->stop();
  migration_->sendBoundaryToken();  // a leaver going without its switchover still lets the joiner vote
  migration_->abstain();
  client_->leave();
  device_->close(deadlineAfterMs(std::min<int64_t>(timeoutMs_, 2000)));
}

void Communicator::checkRank(int r, const char* what) const {
  ECCL_CHECK_ARG(r >= 0 && r < size(), "{}: rank {} is outside [0, {})", what, r, size());
}

void Communicator::checkBuffer(const void* p, size_t count, const char* what) {
  ECCL_CHECK_ARG(p != nullptr || count == 0, "{} is NULL with count {}", what, count);
}

size_t Communicator::checkedBytesOrFail(size_t count, ecclDataType_t type, size_t multiplier, const char* what) {
  ECCL_CHECK_ARG(type >= 0 && type < ecclNumTypes, "{}: invalid data type {}", what, static_cast<int>(type));
  const size_t limit = size_t(1) << 46;  // 64 TiB: far past any host buffer, far from overflow
  const size_t es = typeSize(type);
  const size_t per = es * std::max<size_t>(multiplier, 1);
  // Both under 2^32 and 2^14: the product is under the limit, no division.
  const bool small = count < (size_t(1) << 32) && per <= (size_t(1) << 14);
  ECCL_CHECK_ARG(multiplier < limit && (small || count <= limit / per),
                 "{}: count {} x {} ranks of {} overflows the byte size limit", what, count, multiplier,
                 coll::typeName(type));
  return count * es * multiplier;
}

std::string Communicator::opLabel(const char* name, uint64_t seq) const {
  return fmt::format("{} (rank {}, epoch {}, op {})", name, rank_, view_.epoch, seq);
}

void Communicator::runCollective(const char* name, const transport::CallSignature& signature,
                                 FunctionRef<void(OpLinks&)> body, const void* out, size_t outBytes) {
  checkUsable();
  if (fast_->framesWaiting()) device_->poll();
  uint64_t seq = ++collSeq_;
  if (std::optional<std::string> refused =
          device_->collectiveStarts(seq, checkCalls_ ? &signature : nullptr, takeEndedWell())) {
    device_->collectiveEnds(seq, false);
    fail(ecclInvalidUsage, "{}", *refused);
  }
  // A call of no elements moves nothing, but its signature must still
  // reach the peers, or a rank that says 0 where the others say 16 leaves
  // them waiting: it exchanges a barrier's empty messages instead.
  bool empty = signature.count == 0 && signature.kind != transport::CallKind::kAllToAllv &&
               signature.kind != transport::CallKind::kBarrier;
  try {
    OpLinks links(*this, seq, name, checkCalls_ ? &signature : nullptr);
    fast_->beginOp(view_.epoch, seq, checkCalls_ ? &signature : nullptr, links.deadline());
    if (checkCalls_ && empty && size() > 1)
      coll::barrierTree(links);
    else
      body(links);
  } catch (...) {
    device_->collectiveEnds(seq, false);
    dropSandboxRecording("a recorded call failed");
    throw;
  }
  // Told with the next op's start (one device lock per op, not two): a
  // refusal of this op heard meanwhile is news only to that next op,
  // which the device refuses naming it either way.
  endedWell_ = {view_.epoch, seq};
  recordForSandbox(signature, out, outBytes);
}

uint64_t Communicator::takeEndedWell() {
  const auto [epoch, seq] = endedWell_;
  endedWell_ = {};
  return epoch == view_.epoch ? seq : 0;  // the device forgot an older view's ops
}

void Communicator::refuseCollective(const std::string& why) {
  if (standby_ || sandboxed() || size() < 2) return;  // nobody waits for this rank's part
  if (const uint64_t ended = takeEndedWell()) device_->collectiveEnds(ended, true);
  const uint64_t seq = ++collSeq_;
  device_->refuseCall(seq, fmt::format("rank {} refused its part of collective op {} (epoch {}): {}", rank_, seq,
                                       epoch(), why));
}

void Communicator::refusing(FunctionRef<void()> checks) {
  try {
    checks();
  } catch (const Error& e) {
    if (e.code() == ecclInvalidArgument) refuseCollective(e.what());
    throw;
  }
}

namespace {

transport::CallSignature signatureOf(transport::CallKind kind, size_t count, int type = -1, int op = -1,
                                     int root = -1) {
  transport::CallSignature s;
  s.kind = kind;
  s.count = count;
  s.type = static_cast<int8_t>(type);
  s.op = static_cast<int8_t>(op);
  s.root = root;
  return s;
}

}  // namespace

namespace {

void checkOp(ecclRedOp_t op, const char* what) {
  ECCL_CHECK_ARG(op >= 0 && op < ecclNumOps, "{}: invalid reduction op {}", what, static_cast<int>(op));
}

// Runs a reduction in the type the algorithm should see: float16 and
// bfloat16 go through float32 (one rounding at the end), and avg divides once.
void reduceWide(const void* in, size_t inCount, void* out, size_t outCount, ecclDataType_t type,
                ecclRedOp_t op, int nranks, bool haveOutput,
                FunctionRef<void(const void*, void*, ecclDataType_t)> run) {
  if (!coll::isHalfType(type)) {
    run(in, out, type);
    if (op == ecclAvg && haveOutput) coll::finishAverage(out, outCount, type, nranks);
    return;
  }
  std::vector<float> wideIn(inCount), wideOut(outCount);
  coll::widenToFloat(in, wideIn.data(), inCount, type);
  run(wideIn.data(), wideOut.data(), ecclFloat32);
  if (!haveOutput) return;
  if (op == ecclAvg) coll::finishAverage(wideOut.data(), outCount, ecclFloat32, nranks);
  coll::narrowFromFloat(wideOut.data(), out, outCount, type);
}

}  // namespace

// auto: recursive doubling at 4 ranks on 2 cores, 8 B to 4 KiB, took half
// the tree's time (shm 3.5 against 7-13 us, TCP 35-45 against 55-75 us);
// from 16 KiB the tree's pipelined segments won (shm 25-35 against 47-80 us).
// The same bound (a fast-path slot) holds for the other latency trees.
constexpr size_t kLatencyMaxBytes = 4096;
// Halving and doubling sends 2 log2 N messages of shrinking size where
// doubling sends log2 N whole vectors: at 4 ranks (medians of five runs) it
// won from 8 KiB on shm (11.9 against 17.4 us) but only from 64 KiB on TCP
// (84 against 88 us; at 16 KiB 54 against 41 us), and took 0.72-0.82x the
// tree's time at 256 KiB. At 2 ranks both exchange one whole vector, and
// halving lost everywhere on TCP (24 against 21 us at 64 KiB).
constexpr size_t kDoublingMaxBytes = 16384;

void Communicator::checkLatencyAlgorithms() {
  if (latencyCheckedForSize_ == size()) return;
  latencyCheckedForSize_ = size();
  doublingIsFree_ = coll::doublingNeedsOnlyLatencyPeers(size());
  everyPairConnected_ = coll::everyPairIsALatencyPeer(size());
}

params::SmallAllreduce Communicator::smallAllreduceFor(size_t bytes) {
  using params::SmallAllreduce;
  // At two ranks the tree and doubling are one exchange; only halving, when forced, differs.
  if (size() == 2 && smallAllreduceAlgorithm_ != SmallAllreduce::kHalving) return SmallAllreduce::kDoubling;
  if (smallAllreduceAlgorithm_ != SmallAllreduce::kAuto) return smallAllreduceAlgorithm_;
  checkLatencyAlgorithms();
  if (!doublingIsFree_) return SmallAllreduce::kTree;
  return bytes <= kDoublingMaxBytes ? SmallAllreduce::kDoubling : SmallAllreduce::kHalving;
}

// Where reading in place overtook the lanes (busbw, medians of 5-11
// alternating runs, same build). While the slots held 4 KiB: allreduce at
// 128 KiB at 2 ranks (1.18x; 0.82-0.96x from 8 to 64 KiB: one exchange of
// the whole vector against three rounds of messages) and at 32 KiB at 4
// (1.47x); broadcast, all-gather and reduce-scatter (every rank's part
// counted) at 16 KiB at 2 ranks and 64 KiB at 4. With 16 KiB slots the
// lanes win wherever their messages fit a slot: at 4 ranks allreduce at
// 32 KiB (1.18x and 2.00x; 0.61x at 64 KiB), the other three at 64 KiB
// (1.14-1.38x in two sets; 0.43-0.92x at 128 KiB); at 2 ranks all-gather
// and reduce-scatter at 32 KiB (1.29x, 1.92x; ties at 64 KiB) and
// broadcast at 16 KiB (1.05x; 0.54x at 32 KiB).
// Reading in place opens a lane to every peer (the rounds of messages and
// the probe): 7 per rank at 8 ranks, as NCCL's node-local peers; beyond
// that the lanes' memory and the connections a reconfiguration would
// touch outweigh it, and the ring keeps its two neighbours.
constexpr int kDirectMaxRanks = 8;

// Members in one network namespace form a class, so where one rank finds
// every peer there, every rank does: all decide alike without a message,
// and no rank asks a member on another host for anything.
bool Communicator::everyRankOnThisHost() {
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank_) continue;
    const transport::MemberId member = view_.rankToMember[peer];
    auto [known, fresh] = sharesHost_.try_emplace(member, false);
    if (fresh) known->second = device_->sharesHostWith(member);
    if (!known->second) return false;
  }
  return true;
}

// The direct collectives' conditions a view's members decide alone (the
// sizes aside): a preparation opens every lane they will need, and the
// device remembers who shares this host (a look at /proc/net/unix, 20-250
// us with a job's sockets in it, that the switchover then does not pay).
bool Communicator::viewReadsEveryPeer(const std::vector<transport::MemberId>& members) {
  if (directBytes_ == 0 || members.size() < 2 || members.size() > kDirectMaxRanks) return false;
  return std::all_of(members.begin(), members.end(),
                     [this](transport::MemberId m) { return m == self_ || device_->sharesHostWith(m); });
}

size_t Communicator::readsDirectlyFrom(DirectShape shape) const {
  const bool two = size() == 2;
  switch (shape) {
    case DirectShape::kAllReduce: return (two ? 4 : 2) * directBytes_;
    case DirectShape::kBroadcast: return (two ? 1 : 4) * directBytes_;
    default: return (two ? 2 : 4) * directBytes_;
  }
}

bool Communicator::readDirectly(DirectShape shape, size_t messageBytes, FunctionRef<bool()> algorithm) {
  const size_t from = readsDirectlyFrom(shape);
  if (directBytes_ == 0 || messageBytes < from || size() < 2 || size() > kDirectMaxRanks ||
      directRefusedEpoch_ == view_.epoch || !everyRankOnThisHost())
    return false;
  if (algorithm()) {
    directCollectives_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  directRefusedEpoch_ = view_.epoch;  // every rank saw the same refusal
  return false;
}

bool Communicator::latencyTree(size_t messageBytes) {
  if (messageBytes > kLatencyMaxBytes || size() < 3) return false;
  checkLatencyAlgorithms();
  return everyPairConnected_;
}

void Communicator::allReduce(const void* in, void* out, size_t count, ecclDataType_t type, ecclRedOp_t op) {
  size_t bytes = 0;
  refusing([&]() ECCL_REQUIRES(caller_) {
    bytes = checkedBytes(count, type, 1, "allreduce");
    checkOp(op, "allreduce");
    checkBuffer(in, count, "allreduce sendbuff");
    checkBuffer(out, count, "allreduce recvbuff");
  });
  const auto signature = signatureOf(transport::CallKind::kAllReduce, count, type, op);
  if (sandboxed()) return sandboxCall(signature, out, bytes, [&]() ECCL_REQUIRES(caller_) { sandboxCopy(in, out, bytes); });
  runCollective("allreduce", signature, [&](OpLinks& links) ECCL_REQUIRES(caller_) {
    reduceWide(in, count, out, count, type, op, size(), true, [&](const void* i, void* o, ecclDataType_t t) ECCL_REQUIRES(caller_) {
      if (readDirectly(DirectShape::kAllReduce, bytes, [&] { return coll::allreduceDirect(links, i, o, count, t, op); })) return;
      if (bytes > smallAllreduceBytes_) return coll::allreduceRing(links, i, o, count, t, op);
      switch (smallAllreduceFor(bytes)) {
        case params::SmallAllreduce::kDoubling: return coll::allreduceRecursiveDoubling(links, i, o, count, t, op);
        case params::SmallAllreduce::kHalving: return coll::allreduceHalvingDoubling(links, i, o, count, t, op);
        default: return coll::allreduceTree(links, i, o, count, t, op);
      }
    });
  }, out, bytes);
}

void Communicator::broadcast(const void* in, void* out, size_t count, ecclDataType_t type, int root) {
  size_t bytes = 0;
  refusing([&]() ECCL_REQUIRES(caller_) {
    bytes = checkedBytes(count, type, 1, "broadcast");
    checkRank(root, "broadcast root");
    if (rank_ == root) checkBuffer(in, count, "broadcast sendbuff");
    checkBuffer(out, count, "broadcast recvbuff");
  });
  const auto signature = signatureOf(transport::CallKind::kBroadcast, count, type, -1, root);
  if (sandboxed())
    return sandboxCall(signature, out, bytes, [&]() ECCL_REQUIRES(caller_) { rank_ == root ? sandboxCopy(in, out, bytes) : sandboxZero(out, bytes); });
  runCollective("broadcast", signature, [&](OpLinks& links) ECCL_REQUIRES(caller_) {
    if (readDirectly(DirectShape::kBroadcast, bytes, [&] { return coll::broadcastDirect(links, in, out, bytes, root); })) return;
    if (latencyTree(bytes))
      coll::broadcastBinomial(links, in, out, bytes, root);
    else
      coll::broadcastChain(links, in, out, bytes, root);
  }, out, bytes);
}

void Communicator::reduce(const void* in, void* out, size_t count, ecclDataType_t type, ecclRedOp_t op, int root) {
  size_t reduceBytes = 0;
  refusing([&]() ECCL_REQUIRES(caller_) {
    reduceBytes = checkedBytes(count, type, 1, "reduce");
    checkOp(op, "reduce");
    checkRank(root, "reduce root");
    checkBuffer(in, count, "reduce sendbuff");
    if (rank_ == root) checkBuffer(out, count, "reduce recvbuff");
  });
  const auto signature = signatureOf(transport::CallKind::kReduce, count, type, op, root);
  const size_t outBytes = rank_ == root ? reduceBytes : 0;
  if (sandboxed())
    return sandboxCall(signature, out, outBytes, [&]() ECCL_REQUIRES(caller_) { if (outBytes) sandboxCopy(in, out, reduceBytes); });
  runCollective("reduce", signature, [&](OpLinks& links) ECCL_REQUIRES(caller_) {
    reduceWide(in, count, out, count, type, op, size(), rank_ == root,
               [&](const void* i, void* o, ecclDataType_t t) ECCL_REQUIRES(caller_) {
                 if (latencyTree(count * coll::typeSize(t)))
                   coll::reduceBinomial(links, i, o, count, t, op, root);
                 else
                   coll::reduceChain(links, i, o, count, t, op, root);
               });
  }, out, outBytes);
}

void Communicator::allGather(const void* in, void* out, size_t sendCount, ecclDataType_t type) {
  size_t bytes = 0;
  refusing([&]() ECCL_REQUIRES(caller_) {
    bytes = checkedBytes(sendCount, type, 1, "allgather");
    checkedBytes(sendCount, type, size(), "allgather");
    checkBuffer(in, sendCount, "allgather sendbuff");
    checkBuffer(out, sendCount, "allgather recvbuff");
  });
  const auto signature = signatureOf(transport::CallKind::kAllGather, sendCount, type);
  if (sandboxed())
    return sandboxCall(signature, out, bytes * size(), [&]() ECCL_REQUIRES(caller_) {
      sandboxZero(out, bytes * size());
      sandboxCopy(in, static_cast<uint8_t*>(out) + bytes * rank_, bytes);
    });
  runCollective("allgather", signature, [&](OpLinks& links) ECCL_REQUIRES(caller_) {
    if (readDirectly(DirectShape::kParts, bytes * size(), [&] { return coll::allGatherDirect(links, in, out, bytes); })) return;
    const bool powerOfTwo = (size() & (size() - 1)) == 0;
    if (powerOfTwo && latencyTree(bytes * size_t(size() / 2)))
      coll::allGatherDoubling(links, in, out, bytes);
    else
      coll::allGatherRing(links, in, out, bytes);
  }, out, bytes * size());
}

void Communicator::reduceScatter(const void* in, void* out, size_t recvCount, ecclDataType_t type, ecclRedOp_t op) {
  size_t scatterBytes = 0;
  refusing([&]() ECCL_REQUIRES(caller_) {
    scatterBytes = checkedBytes(recvCount, type, 1, "reducescatter");
    checkedBytes(recvCount, type, size(), "reducescatter");
    checkOp(op, "reducescatter");
    checkBuffer(in, recvCount, "reducescatter sendbuff");
    checkBuffer(out, recvCount, "reducescatter recvbuff");
  });
  const auto signature = signatureOf(transport::CallKind::kReduceScatter, recvCount, type, op);
  if (sandboxed())
    return sandboxCall(signature, out, scatterBytes, [&]() ECCL_REQUIRES(caller_) {
      sandboxCopy(static_cast<const uint8_t*>(in) + scatterBytes * rank_, out, scatterBytes);
    });
  runCollective("reducescatter", signature, [&](OpLinks& links) ECCL_REQUIRES(caller_) {
    reduceWide(in, recvCount * size(), out, recvCount, type, op, size(), true,
               [&](const void* i, void* o, ecclDataType_t t) ECCL_REQUIRES(caller_) {
                 if (readDirectly(DirectShape::kParts, scatterBytes * size(),
                                  [&] { return coll::reduceScatterDirect(links, i, o, recvCount, t, op); }))
                   return;
                 coll::reduceScatterRing(links, i, o, recvCount, t, op);
               });
  }, out, scatterBytes);
}

void Communicator::allToAll(const void* in, void* out, size_t count, ecclDataType_t type) {
  size_t bytes = 0;
  refusing([&]() ECCL_REQUIRES(caller_) {
    bytes = checkedBytes(count, type, 1, "alltoall");
    checkedBytes(count, type, size(), "alltoall");
    checkBuffer(in, count, "alltoall sendbuff");
    checkBuffer(out, count, "alltoall recvbuff");
    ECCL_CHECK_ARG(in != out || count == 0 || size() == 1, "alltoall: in-place operation is not supported");
  });
  std::vector<size_t> sizes(size(), bytes), offsets(size());
  for (int r = 0; r < size(); ++r) offsets[r] = bytes * r;
  const auto signature = signatureOf(transport::CallKind::kAllToAll, count, type);
  if (sandboxed())
    return sandboxCall(signature, out, bytes * size(), [&]() ECCL_REQUIRES(caller_) {
      sandboxZero(out, bytes * size());
      sandboxCopy(static_cast<const uint8_t*>(in) + offsets[rank_], static_cast<uint8_t*>(out) + offsets[rank_], bytes);
    });
  runCollective("alltoall", signature, [&](OpLinks& links) ECCL_REQUIRES(caller_) {
    coll::allToAllvPairwise(links, in, sizes.data(), offsets.data(), out, sizes.data(), offsets.data());
  }, out, bytes * size());
}

void Communicator::allToAllv(const void* in, const size_t* sendCounts, const size_t* sendDispls, void* out,
                             const size_t* recvCounts, const size_t* recvDispls, ecclDataType_t type) {
  std::vector<size_t> sb(size()), so(size()), rb(size()), ro(size());
  refusing([&]() ECCL_REQUIRES(caller_) {
    ECCL_CHECK_ARG(sendCounts && sendDispls && recvCounts && recvDispls,
                   "alltoallv: counts and displacements must not be NULL");
    checkedBytes(1, type, 1, "alltoallv");
    size_t anySend = 0, anyRecv = 0;
    for (int r = 0; r < size(); ++r) {
      sb[r] = checkedBytes(sendCounts[r], type, 1, "alltoallv sendcounts");
      rb[r] = checkedBytes(recvCounts[r], type, 1, "alltoallv recvcounts");
      so[r] = checkedBytes(sendDispls[r], type, 1, "alltoallv sdispls");
      ro[r] = checkedBytes(recvDispls[r], type, 1, "alltoallv rdispls");
      anySend += sendCounts[r];
      anyRecv += recvCounts[r];
    }
    ECCL_CHECK_ARG(sb[rank_] == rb[rank_], "alltoallv: rank {} sends itself {} elements but expects {}", rank_,
                   sendCounts[rank_], recvCounts[rank_]);
    checkBuffer(in, anySend, "alltoallv sendbuff");
    checkBuffer(out, anyRecv, "alltoallv recvbuff");
  });
  // Recorded by signature only: its blocks need not tile the buffer.
  const auto signature = signatureOf(transport::CallKind::kAllToAllv, 0, type);
  if (sandboxed())
    return sandboxCall(signature, nullptr, 0, [&]() ECCL_REQUIRES(caller_) {
      for (int r = 0; r < size(); ++r) sandboxZero(static_cast<uint8_t*>(out) + ro[r], rb[r]);
      sandboxCopy(static_cast<const uint8_t*>(in) + so[rank_], static_cast<uint8_t*>(out) + ro[rank_], sb[rank_]);
    });
  // Counts differ per pair by design; each message's size is checked.
  runCollective("alltoallv", signature, [&](OpLinks& links) ECCL_REQUIRES(caller_) {
    coll::allToAllvPairwise(links, in, sb.data(), so.data(), out, rb.data(), ro.data());
  });
}

void Communicator::barrier() {
  const auto signature = signatureOf(transport::CallKind::kBarrier, 0);
  if (sandboxed()) return sandboxCall(signature, nullptr, 0, [] {});
  runCollective("barrier", signature, [&](OpLinks& links) { coll::barrierTree(links); });
}

transport::RequestPtr Communicator::postSend(const void* buf, size_t bytes, int peer, ecclDataType_t type) {
  auto signature = signatureOf(transport::CallKind::kSend, bytes / coll::typeSize(type), type);
  // Recorded and replayed with the peer: a sandbox's step is matched call by call.
  const auto recorded = signatureOf(transport::CallKind::kSend, signature.count, type, -1, peer);
  if (sandboxed()) return sandboxPointToPoint(recorded, nullptr, 0);
  checkUsable();
  recordForSandbox(recorded, nullptr, 0);
  const transport::CallSignature* checked = checkCalls_ ? &signature : nullptr;
  if (!sendLog_.logsTo(peer)) {
    uint64_t seq = transport::FrameHeader::kP2pBit | ++sendSeq_[peer];
    return device_->isend(view_.rankToMember[peer], seq, 0, buf, bytes, nullptr, checked);
  }
  auto reservation = sendLog_.reserve(view_.epoch, peer, type, bytes, deadlineAfterMs(timeoutMs_),
                                      fmt::format("send to rank {} (rank {}, epoch {})", peer, rank_, view_.epoch));
  uint64_t seq = transport::FrameHeader::kP2pBit | ++sendSeq_[peer];
  transport::RequestPtr request;
  try {
    request = device_->isend(view_.rankToMember[peer], seq, 0, buf, bytes, nullptr, checked);
  } catch (...) {
    sendLog_.abandon(reservation);
    throw;
  }
  // The connections are serviced between chunks of the copy so the socket
  // never sits full while we copy.
  sendLog_.copy(request.get(), reservation, buf, bytes, [this] { device_->progress(); });
  return request;
}

transport::RequestPtr Communicator::postRecv(void* buf, size_t bytes, int peer, ecclDataType_t type) {
  auto signature = signatureOf(transport::CallKind::kRecv, bytes / coll::typeSize(type), type);
  const auto recorded = signatureOf(transport::CallKind::kRecv, signature.count, type, -1, peer);
  if (sandboxed()) return sandboxPointToPoint(recorded, buf, bytes);
  checkUsable();
  uint64_t seq = transport::FrameHeader::kP2pBit | ++recvSeq_[peer];
  auto request = device_->irecv(view_.rankToMember[peer], seq, 0, buf, bytes, checkCalls_ ? &signature : nullptr);
  recordReceivePosted(recorded, request, buf, bytes);
  return request;
}

int Communicator::probe(int peer, size_t* bytes) {
  checkUsable();
  device_->progress();
  int first = -1;
  uint64_t firstOrder = 0;
  for (int r = 0; r < size(); ++r) {
    if (r == rank_ || (peer >= 0 && r != peer)) continue;
    const uint64_t seq = transport::FrameHeader::kP2pBit | (recvSeq_[r] + 1);
    size_t n;
    uint64_t order;
    if (device_->arrived(view_.rankToMember[r], seq, 0, &n, &order) && (first < 0 || order < firstOrder))
      first = r, *bytes = n, firstOrder = order;
  }
  return first;
}

bool Communicator::testP2p(const transport::RequestPtr& r, int peer, bool isSend) {
  try {
    if (!device_->test(r, {})) return false;
  } catch (const Error& e) {
    dropSandboxRecording("a recorded send or receive failed");
    if (isSend) sendLog_.settle(r.get(), false);
    throw Error(e.code(), fmt::format("{} {} rank {} (rank {}, epoch {}): {}", isSend ? "send" : "recv",
                                      isSend ? "to" : "from", peer, rank_, view_.epoch, e.what()));
  }
  if (isSend) sendLog_.settle(r.get(), true);
  else recordReceiveDone(r);
  return true;
}

void Communicator::waitP2p(const transport::RequestPtr& r, int peer, bool isSend) {
  try {
    device_->wait(r, deadlineAfterMs(timeoutMs_), {});
  } catch (const Error& e) {
    dropSandboxRecording("a recorded send or receive failed");
    if (isSend) sendLog_.settle(r.get(), false);
    throw Error(e.code(), fmt::format("{} {} rank {} (rank {}, epoch {}): {}", isSend ? "send" : "recv",
                                      isSend ? "to" : "from", peer, rank_, view_.epoch, e.what()));
  } catch (...) {
    dropSandboxRecording("a recorded send or receive failed");
    if (isSend) sendLog_.settle(r.get(), false);
    throw;
  }
  if (isSend) sendLog_.settle(r.get(), true);
  else recordReceiveDone(r);
}

}  // namespace eccl
