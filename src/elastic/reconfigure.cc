// Two-phase reconfiguration: an expected migration is prepared in the
// background (the next view's missing connections open while collectives
// keep running on the current one) and becomes current at a switchover
// that every member calls at a collective boundary. Grow appends standbys.
#include <algorithm>

#include "coll/algorithms.h"
#include "common/error.h"
#include "common/log.h"
#include "common/params.h"
#include "core/communicator.h"
#include "transport/frame.h"

namespace eccl {

namespace {

// Sequence numbers of the leaver-to-joiner channel: their own space, apart
// from collectives and send/recv of the view.
constexpr uint64_t kMigrationBit = 1ull << 62;

// The switchover's agreement traffic (survives revocation): the vote's two
// directions are tags of one sequence number per epoch; the leaver's
// boundary token has its own.
constexpr uint32_t kVoteUp = 0, kVoteDown = 1;
uint64_t voteSeq(uint32_t nextEpoch) {
  return transport::FrameHeader::kP2pBit | transport::FrameHeader::kAgreementBit | nextEpoch;
}
uint64_t boundaryTokenSeq(uint32_t nextEpoch) { return voteSeq(nextEpoch) | kMigrationBit; }

double msSince(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

int rankIn(const std::vector<bootstrap::ViewEntry>& view, transport::MemberId m) {
  for (size_t r = 0; r < view.size(); ++r)
    if (view[r].member == m) return static_cast<int>(r);
  return -1;
}

}  // namespace

void Communicator::onReconfiguration(const bootstrap::CoordMessage& m) {
  using bootstrap::CoordKind;
  if (m.kind == CoordKind::kStandbys) {
    worker_->post([this, list = m.entries] { connectStandbys(list); });
    return;
  }
  MutexLock lock(prepMu_);
  switch (m.kind) {
    case CoordKind::kPrepare:
      prep_ = Preparation{};
      prep_.state = ecclPreparePreparing;
      prep_.epoch = m.epoch;
      prep_.next = m.entries;
      prep_.leavingRank = static_cast<int>(m.rank);
      prep_.joiner = m.member;
      prep_.leavers = m.members;
      prep_.leaverAddress = m.address;
      prep_.why = m.text;
      prep_.announced = Clock::now();
      for (const auto& e : prep_.next) prep_.lanesAtAnnounce.emplace_back(e.member, device_->lanesUp(e.member));
      for (transport::MemberId l : prep_.leavers) prep_.lanesAtAnnounce.emplace_back(l, device_->lanesUp(l));
      addPreparedPeersLocked();
      worker_->post([this, epoch = m.epoch] { prepareDelta(epoch); });
      break;
    case CoordKind::kPrepareReady:
      if (m.epoch != prep_.epoch || prep_.state == ecclPrepareFailed) break;
      prep_.everyonePrepared = true;
      prep_.state = ecclPrepareReady;
      break;
    case CoordKind::kPrepareFailed:
      // Epoch 0 answers a migration request the coordinator refused.
      if (m.epoch != prep_.epoch && m.epoch != 0) break;
      prep_.state = ecclPrepareFailed;
      prep_.why = m.text;
      log::warn("rank {}: {}", rank_, m.text);
      // Wake a state stream waiting on the other end of the migration.
      if (m.epoch != 0) {
        if (prep_.joiner != self_ && prep_.joiner != 0) device_->failPeer(prep_.joiner, ecclRemoteError, m.text);
        if (prep_.joiner == self_)
          for (transport::MemberId l : prep_.leavers) device_->failPeer(l, ecclRemoteError, m.text);
      }
      break;
    default:
      break;
  }
  prepCv_.notifyAll();
}

// Everyone in the next view, plus the leaver-joiner pair, must be known to
// the device before the other side dials (it accepts known members only)
// and before the state stream is posted.
void Communicator::addPreparedPeersLocked() {
  const auto& next = prep_.next;
  for (size_t r = 0; r < next.size(); ++r)
    if (next[r].member != self_ && !device_->hasPeer(next[r].member))
      device_->addPeer(next[r].member, next[r].address,
                       fmt::format("rank {} of epoch {} ({})", r, prep_.epoch, next[r].address),
                       transport::Device::PeerRole::kCandidate);
  if (prep_.joiner == self_)
    for (transport::MemberId l : prep_.leavers)
      if (!device_->hasPeer(l))
        device_->addPeer(l, prep_.leaverAddress, fmt::format("the leaving member {:016x} ({})", l, prep_.leaverAddress),
                         transport::Device::PeerRole::kCandidate);
}

// Opens what this member needs of the next view that it does not have: its
// ring neighbours there and, for the leaver and the joiner, each other.
// Dials first, then waits for the connections others dial to us.
void Communicator::prepareDelta(uint32_t nextEpoch) {
  std::vector<bootstrap::ViewEntry> next;
  transport::MemberId joiner;
  std::vector<transport::MemberId> leavers;
  std::vector<std::pair<transport::MemberId, uint32_t>> lanesAtAnnounce;
  {
    MutexLock lock(prepMu_);
    if (prep_.epoch != nextEpoch || prep_.state == ecclPrepareFailed) return;
    next = prep_.next;
    joiner = prep_.joiner;
    leavers = prep_.leavers;
    lanesAtAnnounce = prep_.lanesAtAnnounce;
  }
  std::vector<transport::MemberId> needed;
  int me = rankIn(next, self_);
  if (me >= 0)
    for (int peer : coll::latencyPeers(me, static_cast<int>(next.size()))) needed.push_back(next[peer].member);
  bool isLeaver = std::count(leavers.begin(), leavers.end(), self_) > 0;
  if (isLeaver) needed.push_back(joiner);
  if (self_ == joiner) needed.insert(needed.end(), leavers.begin(), leavers.end());
  std::string failure;
  std::sort(needed.begin(), needed.end());
  needed.erase(std::unique(needed.begin(), needed.end()), needed.end());
  uint64_t opened = 0;
  try {
    connectPeers(needed, deadlineAfterMs(timeoutMs_));
    // Lanes between the joiner and the others are the delta, whichever side
    // dialed, unless they were up before (an eager standby).
    for (transport::MemberId m : needed) {
      if (m == self_ || (self_ != joiner && m != joiner)) continue;
      uint32_t had = 0;
      for (const auto& [member, lanes] : lanesAtAnnounce)
        if (member == m) had = lanes;
      uint32_t up = device_->lanesUp(m);
      opened += up > had ? up - had : 0;
    }
  } catch (const Error& e) {
    failure = e.what();
    MutexLock lock(reporterMu_);
    if (reporter_) reporter_->report(self_ == joiner ? leavers.front() : joiner,
                                     fmt::format("preparing epoch {}: {}", nextEpoch, e.what()));
  }
  MutexLock lock(prepMu_);
  if (prep_.epoch != nextEpoch) return;
  if (!failure.empty()) {
    // Reported above: the coordinator aborts the preparation for everyone
    // with one reason (naming the joiner or the failed member), so all
    // members see the same FAILED.
    log::warn("rank {}: preparing epoch {}: {}", rank_, nextEpoch, failure);
  } else {
    prep_.locallyPrepared = true;
    prep_.prepareMs = msSince(prep_.announced);
    prep_.connectionsOpened = opened;
    MutexLock rlock(reporterMu_);
    if (reporter_) reporter_->prepared(nextEpoch);
  }
  prepCv_.notifyAll();
}

// An eager standby and the members keep idle connections between them; the
// lower member id dials, the other only has to know the peer.
void Communicator::connectStandbys(std::vector<bootstrap::ViewEntry> peers) {
  Deadline deadline = deadlineAfterMs(std::min<int64_t>(timeoutMs_, params::handshakeTimeoutMs()));
  for (const auto& e : peers) {
    if (e.member == self_) continue;
    if (!device_->hasPeer(e.member))
      device_->addPeer(e.member, e.address, fmt::format("member {:016x} ({})", e.member, e.address),
                       transport::Device::PeerRole::kCandidate);
  }
  for (const auto& e : peers) {
    if (e.member < self_) continue;  // it dials us
    try {
      device_->connectNow(e.member, deadline);
    } catch (const Error& err) {
      log::info("eager connection to {:016x} not opened: {}", e.member, err.what());
    }
  }
}

void Communicator::prepareMigration(int rank) {
  checkUsable();
  checkRank(rank, "ecclCommPrepare");
  {
    MutexLock lock(prepMu_);
    if (prep_.state == ecclPreparePreparing || prep_.state == ecclPrepareReady) {
      if (prep_.leavingRank == rank || prep_.epoch == 0) return;
      fail(ecclInvalidUsage, "ecclCommPrepare: rank {} is already being migrated", prep_.leavingRank);
    }
    prep_ = Preparation{};
    prep_.state = ecclPreparePreparing;
    prep_.leavingRank = rank;
  }
  client_->requestMigration(rank);
}

ecclPrepareState_t Communicator::prepareStatus(std::string* why, int* leavingRank) const {
  MutexLock lock(prepMu_);
  *why = prep_.why;
  *leavingRank = prep_.state == ecclPreparePreparing || prep_.state == ecclPrepareReady ? prep_.leavingRank : -1;
  return prep_.state;
}

void Communicator::becomeJoiner(const bootstrap::ViewUpdate& v) {
  joining_ = true;
  rank_ = v.rank;
  view_.epoch = v.epoch - 1;
  view_.rankToMember.clear();
  for (const auto& e : v.entries) view_.rankToMember.push_back(e.member);
  // The leaver streams its state in the current epoch.
  device_->setEpoch(v.epoch - 1);
  currentEpoch_ = v.epoch - 1;
}

// The switchover is decided in band: once the coordinator has said READY,
// every member of the next view votes over the links the preparation
// opened (voteOnSwitch) and, on a unanimous yes, enters the next view on its
// own and only then tells the coordinator. A vote that misses someone asks
// the coordinator, which commits if any member saw yes and aborts if none
// did (docs/elastic.md, "Switchover").
void Communicator::switchover() {
  if (!leftView_.empty()) fail(ecclInvalidUsage, "ecclCommSwitchover: {}", leftView_);
  // A revoked member still votes (no), so the others' votes end at once.
  std::string revoked;
  if (!joining_) {
    try {
      checkUsable();
    } catch (const Error& e) {
      if (e.code() == ecclEvicted) throw;
      revoked = e.what();
    }
  }
  auto start = Clock::now();
  uint32_t nextEpoch;
  std::vector<bootstrap::ViewEntry> next;
  std::vector<transport::MemberId> leavers;
  transport::MemberId joiner;
  std::string story;
  {
    MutexLock lock(prepMu_);
    Deadline deadline = deadlineAfterMs(timeoutMs_);
    if (prep_.state == ecclPrepareNone)
      fail(ecclInvalidUsage, "ecclCommSwitchover (rank {}): no reconfiguration is being prepared", rank_);
    while (prep_.state != ecclPrepareFailed && !(prep_.epoch != 0 && prep_.everyonePrepared)) {
      if (!prepCv_.waitUntil(prepMu_, deadline) && Clock::now() >= deadline)
        fail(ecclTimeout, "ecclCommSwitchover (rank {}): the members of epoch {} were not all prepared before the deadline",
             rank_, prep_.epoch);
    }
    if (prep_.state == ecclPrepareFailed)
      fail(ecclRemoteError, "ecclCommSwitchover (rank {}): the preparation failed: {}", rank_, prep_.why);
    nextEpoch = prep_.epoch;
    next = prep_.next;
    leavers = prep_.leavers;
    joiner = prep_.joiner;
    story = prep_.why;
    reconfig_.connectionsPrepared = prep_.connectionsOpened;
    reconfig_.prepareMs = prep_.prepareMs;
  }
  if (std::count(leavers.begin(), leavers.end(), self_)) return leaveAtSwitchover(nextEpoch);
  bool yes = revoked.empty();
  std::string why = revoked;
  if (self_ == joiner) {
    // The leaver's token: it has finished its last op of the old view.
    for (transport::MemberId l : leavers) {
      uint8_t token = 0;
      uint64_t seq = boundaryTokenSeq(nextEpoch);
      try {
        device_->wait(device_->irecv(l, seq, 0, &token, 1), deadlineAfterMs(timeoutMs_),
                      fmt::format("ecclCommSwitchover (joiner of rank {}), waiting for the leaver", rank_));
      } catch (const Error& e) {
        yes = false;
        why = e.what();
      }
    }
  }
  yes = voteOnSwitch(next, nextEpoch, yes, why.empty() ? &why : nullptr) && yes;
  bootstrap::ViewUpdate v;
  v.epoch = nextEpoch;
  v.rank = rankIn(next, self_);
  v.entries = next;
  v.why = story;
  // Entering the view connects its latency peers; one that died after its
  // vote fails that, and the view stands, revoked, to recover from.
  auto enter = [&](const bootstrap::ViewUpdate& view) {
    try {
      enterNextView(view, leavers);
    } catch (const Error& e) {
      throw Error(e.code(), fmt::format("ecclCommSwitchover (rank {}): epoch {} is current, but a member of it is gone: "
                                        "{}; call ecclCommRecover",
                                        rank_, view.epoch, e.what()));
    }
  };
  if (yes) {
    client_->reportSwitched(nextEpoch, rankIn(next, self_) == 0);  // the tree's root: one wakeup, not N
    auto agreed = Clock::now();
    uint32_t oldEpoch = view_.epoch;
    enter(v);
    finishReconfiguration(start, agreed, oldEpoch, "switched over");
    return;
  }
  client_->reportSwitchFailed(nextEpoch, why);
  v = awaitSwitchDecision();
  // Committed: another member saw everyone vote yes, so the next view is
  // current, but a member of it is gone; the caller recovers from there.
  auto agreed = Clock::now();
  uint32_t oldEpoch = view_.epoch;
  enter(v);
  finishReconfiguration(start, agreed, oldEpoch, "switched over");
  fail(ecclRemoteError,
       "ecclCommSwitchover (rank {}): epoch {} is current, but this member's vote missed a member: {}; call "
       "ecclCommRecover",
       rank_, v.epoch, why);
}

// A minimum up the next view's binary tree and the root's answer back down
// (2 log2 N hops), on links its preparation opened. A member whose child
// or parent is gone counts that as a no and still sends on (agreement
// traffic survives revocation), so every live member finishes; yes only if
// every member voted yes. A member that dies after sending its yes can
// leave a split (its subtree never hears the answer): the coordinator
// settles that.
bool Communicator::voteOnSwitch(const std::vector<bootstrap::ViewEntry>& next, uint32_t nextEpoch, bool yes,
                                std::string* why) {
  const int n = static_cast<int>(next.size()), r = rankIn(next, self_);
  const coll::BinaryTree tree = coll::binaryTree(r, n);
  const uint64_t seq = voteSeq(nextEpoch);
  Deadline deadline = deadlineAfterMs(timeoutMs_);
  {
    MutexLock lock(prepMu_);
    prep_.voted = true;
  }
  uint8_t vote = yes ? 1 : 0;
  auto lost = [&](const char* phase, int peer, const Error& e) {
    vote = 0;
    if (why && why->empty())
      *why = fmt::format("switchover vote for epoch {} ({} rank {}): {}", nextEpoch, phase, peer, e.what());
  };
  uint8_t fromChildren[2] = {0, 0};
  transport::RequestPtr recvs[2];
  for (int c = 0; c < tree.childCount; ++c)
    recvs[c] = device_->irecv(next[tree.children[c]].member, seq, kVoteUp, &fromChildren[c], 1);
  for (int c = 0; c < tree.childCount; ++c) {
    try {
      device_->wait(recvs[c], deadline, "");
      vote = std::min(vote, fromChildren[c]);
    } catch (const Error& e) {
      lost("from child", tree.children[c], e);
    }
  }
  if (tree.parent >= 0) {
    transport::MemberId parent = next[tree.parent].member;
    uint8_t up = vote, down = 0;
    auto recv = device_->irecv(parent, seq, kVoteDown, &down, 1);
    try {
      device_->wait(device_->isend(parent, seq, kVoteUp, &up, 1), deadline, "");
    } catch (const Error&) {
      // A dead parent: the receive below fails too.
    }
    try {
      device_->wait(recv, deadline, "");
      vote = down;
    } catch (const Error& e) {
      lost("from parent", tree.parent, e);
    }
  }
  uint8_t decision = vote;
  std::vector<transport::RequestPtr> sends;
  for (int c = 0; c < tree.childCount; ++c)
    sends.push_back(device_->isend(next[tree.children[c]].member, seq, kVoteDown, &decision, 1));
  for (auto& s : sends) {
    try {
      device_->wait(s, deadline, "");
    } catch (const Error&) {
      // A dead child: its own children hear no answer and count a no.
    }
  }
  if (why && why->empty() && !vote) *why = fmt::format("a member voted no on epoch {} (it lost a peer)", nextEpoch);
  return vote == 1;
}

void Communicator::enterNextView(const bootstrap::ViewUpdate& v, const std::vector<transport::MemberId>& leavers) {
  {
    MutexLock lock(prepMu_);
    prep_ = Preparation{};
  }
  joining_ = false;
  applyView(v);
  // The joiner knew the leaver only for the state stream.
  transport::DeviceStats beforeClose = device_->stats();
  for (transport::MemberId l : leavers)
    if (l != self_ && std::find(view_.rankToMember.begin(), view_.rankToMember.end(), l) == view_.rankToMember.end())
      device_->removePeer(l);
  reconfig_.connectionsClosed += device_->stats().connectionsClosed - beforeClose.connectionsClosed;
}

// A member of the next view that will not vote (it recovers or goes away
// instead) sends a no up and a no down at once: a no decides the vote, so
// nobody has to wait for the rest from it.
void Communicator::abstainFromVote() {
  std::vector<bootstrap::ViewEntry> next;
  uint32_t nextEpoch;
  {
    MutexLock lock(prepMu_);
    if (!prep_.everyonePrepared || prep_.voted || prep_.state == ecclPrepareFailed || rankIn(prep_.next, self_) < 0)
      return;
    prep_.voted = true;
    next = prep_.next;
    nextEpoch = prep_.epoch;
  }
  static const uint8_t no = 0;
  const coll::BinaryTree tree = coll::binaryTree(rankIn(next, self_), static_cast<int>(next.size()));
  const uint64_t seq = voteSeq(nextEpoch);
  std::vector<transport::RequestPtr> sends;
  if (tree.parent >= 0) sends.push_back(device_->isend(next[tree.parent].member, seq, kVoteUp, &no, 1));
  for (int c = 0; c < tree.childCount; ++c)
    sends.push_back(device_->isend(next[tree.children[c]].member, seq, kVoteDown, &no, 1));
  for (auto& s : sends) {
    try {
      device_->wait(s, deadlineAfterMs(timeoutMs_), "");
    } catch (const Error&) {
      // That partner is gone; its own partners count it as a no.
    }
  }
}

// Tells the joiner this member has finished its last op of the old view;
// the joiner votes only after that. Sent at switchover, or when a leaver
// destroys its communicator without one.
void Communicator::sendBoundaryToken() {
  uint32_t nextEpoch;
  transport::MemberId joiner;
  {
    MutexLock lock(prepMu_);
    bool leaver = std::count(prep_.leavers.begin(), prep_.leavers.end(), self_) > 0;
    if (!leaver || prep_.epoch == 0 || prep_.state == ecclPrepareFailed || prep_.tokenSent) return;
    prep_.tokenSent = true;
    nextEpoch = prep_.epoch;
    joiner = prep_.joiner;
  }
  static const uint8_t token = 1;
  uint64_t seq = boundaryTokenSeq(nextEpoch);
  try {
    device_->wait(device_->isend(joiner, seq, 0, &token, 1), deadlineAfterMs(timeoutMs_), "");
  } catch (const Error& e) {
    log::info("rank {}: the joiner did not take the boundary token: {}", rank_, e.what());  // its vote fails
  }
}

// The coordinator's answer to a member that cannot tell the outcome alone
// (a no-voter, the leaver): the next view, or why the switchover aborted.
bootstrap::ViewUpdate Communicator::awaitSwitchDecision() {
  try {
    return client_->awaitView(deadlineAfterMs(timeoutMs_), fmt::format("ecclCommSwitchover (rank {})", rank_));
  } catch (const Error& e) {
    MutexLock lock(prepMu_);
    prep_.state = ecclPrepareFailed;
    prep_.why = e.what();
    throw Error(e.code() == ecclInvalidUsage ? ecclRemoteError : e.code(), e.what());
  }
}

void Communicator::leaveAtSwitchover(uint32_t nextEpoch) {
  auto start = Clock::now();
  sendBoundaryToken();
  client_->requestSwitchover(nextEpoch);
  bootstrap::ViewUpdate v = awaitSwitchDecision();
  {
    MutexLock lock(prepMu_);
    prep_ = Preparation{};
  }
  // The others went on without this member and close their links to it;
  // those closings are nobody's failure.
  {
    MutexLock lock(reporterMu_);
    reporter_ = nullptr;
  }
  leftView_ = fmt::format("rank {} left the view at epoch {} ({}); destroy this communicator", rank_, v.epoch, v.why);
  {
    MutexLock lock(errorMu_);
    asyncError_ = ecclInvalidUsage;
    asyncMessage_ = leftView_;
  }
  reconfig_.totalMs = msSince(start);
  log::info("{}", leftView_);
}

void Communicator::grow(int count) {
  checkUsable();
  ECCL_CHECK_ARG(count >= 1, "ecclCommGrow: count={} must be at least 1", count);
  auto start = Clock::now();
  client_->requestGrow(view_.epoch, static_cast<uint32_t>(count));
  bootstrap::ViewUpdate v = client_->awaitView(deadlineAfterMs(timeoutMs_), fmt::format("ecclCommGrow (rank {})", rank_));
  auto agreed = Clock::now();
  uint32_t oldEpoch = view_.epoch;
  applyView(v);
  reconfig_.connectionsPrepared = 0;
  reconfig_.prepareMs = 0;
  finishReconfiguration(start, agreed, oldEpoch, "grew");
}

void Communicator::finishReconfiguration(Clock::time_point start, Clock::time_point agreed, uint32_t oldEpoch,
                                         const char* what) {
  reconfig_.agreeMs = std::chrono::duration<double, std::milli>(agreed - start).count();
  reconfig_.totalMs = msSince(start);
  if (view_.epoch != oldEpoch) reconfigurations_++;
  log::info("rank {} {} into epoch {} with {} ranks in {:.1f} ms ({})", rank_, what, view_.epoch, size(),
            reconfig_.totalMs, lastWhy_);
}

void Communicator::migrationSend(const void* buf, size_t bytes) {
  transport::MemberId joiner;
  {
    MutexLock lock(prepMu_);
    // Asked for but not announced yet: the coordinator answers promptly.
    Deadline deadline = deadlineAfterMs(timeoutMs_);
    while (prep_.state == ecclPreparePreparing && prep_.epoch == 0)
      if (!prepCv_.waitUntil(prepMu_, deadline) && Clock::now() >= deadline)
        fail(ecclTimeout, "ecclMigrationSend (rank {}): the migration was not announced before the deadline", rank_);
    bool leaver = std::count(prep_.leavers.begin(), prep_.leavers.end(), self_) > 0;
    if (prep_.epoch == 0 || prep_.state == ecclPrepareFailed || !leaver)
      fail(ecclInvalidUsage, "ecclMigrationSend (rank {}): this member is not the leaver of a migration being prepared{}{}",
           rank_, prep_.state == ecclPrepareFailed ? ": " : "", prep_.state == ecclPrepareFailed ? prep_.why : "");
    joiner = prep_.joiner;
  }
  uint64_t seq = transport::FrameHeader::kP2pBit | kMigrationBit | ++migrationSendSeq_;
  auto r = device_->isend(joiner, seq, 0, buf, bytes);
  device_->wait(r, deadlineAfterMs(timeoutMs_), fmt::format("ecclMigrationSend (rank {} to its joiner)", rank_));
}

void Communicator::migrationRecv(void* buf, size_t bytes) {
  transport::MemberId leaver;
  {
    MutexLock lock(prepMu_);
    if (prep_.epoch == 0 || prep_.state == ecclPrepareFailed || prep_.joiner != self_ || prep_.leavers.empty())
      fail(ecclInvalidUsage, "ecclMigrationRecv: this member is not the joiner of a migration being prepared{}{}",
           prep_.state == ecclPrepareFailed ? ": " : "", prep_.state == ecclPrepareFailed ? prep_.why : "");
    leaver = prep_.leavers[0];
  }
  uint64_t seq = transport::FrameHeader::kP2pBit | kMigrationBit | ++migrationRecvSeq_;
  auto r = device_->irecv(leaver, seq, 0, buf, bytes);
  device_->wait(r, deadlineAfterMs(timeoutMs_), fmt::format("ecclMigrationRecv (joiner of rank {})", rank_));
}

}  // namespace eccl
