#include "elastic/migration.h"

#include <algorithm>
#include <iterator>

#include "coll/algorithms.h"
#include "common/error.h"
#include "common/log.h"
#include "common/params.h"
#include "transport/backend.h"
#include "transport/connect.h"
#include "transport/frame.h"

namespace eccl::elastic {
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

int rankIn(const std::vector<membership::ViewEntry>& view, transport::MemberId m) {
  for (size_t r = 0; r < view.size(); ++r)
    if (view[r].member == m) return static_cast<int>(r);
  return -1;
}

}  // namespace

Migration::Migration(MigrationLinks links) : links_(std::move(links)), self_(links_.device->self()) {}

void Migration::onAnnouncement(const membership::CoordMessage& m) {
  using membership::CoordKind;
  transport::Device& device = *links_.device;
  MutexLock lock(mu_);
  switch (m.kind) {
    case CoordKind::kPrepare:
      // A coordinator that took over announces again what the last one
      // may not have: a preparation this member has, or settled, stays.
      if (m.epoch <= settledEpoch_ || (m.epoch == prep_.epoch && prep_.state != ecclPrepareNone)) break;
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
      for (const auto& e : prep_.next) prep_.linksAtAnnounce.emplace_back(e.member, device.linksUp(e.member));
      for (transport::MemberId l : prep_.leavers) prep_.linksAtAnnounce.emplace_back(l, device.linksUp(l));
      addPreparedPeersLocked();
      links_.worker->post([this, epoch = m.epoch] { prepareDelta(epoch); });
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
      log::warn("rank {}: {}", rank_.load(), m.text);
      // Wake a state stream waiting on the other end of the migration.
      if (m.epoch != 0) {
        if (prep_.joiner != self_ && prep_.joiner != 0) device.failPeer(prep_.joiner, ecclRemoteError, m.text);
        if (prep_.joiner == self_)
          for (transport::MemberId l : prep_.leavers) device.failPeer(l, ecclRemoteError, m.text);
      }
      break;
    default:
      break;
  }
  cv_.notifyAll();
}

// Everyone in the next view, plus the leaver-joiner pair, must be known to
// the device before the other side dials (it accepts known members only)
// and before the state stream is posted.
void Migration::addPreparedPeersLocked() {
  transport::Device& device = *links_.device;
  const auto& next = prep_.next;
  for (size_t r = 0; r < next.size(); ++r)
    if (next[r].member != self_ && !device.hasPeer(next[r].member))
      device.addPeer(next[r].member, next[r].address, fmt::format("rank {} of epoch {} ({})", r, prep_.epoch, transport::displayAddress(next[r].address)),
                     transport::Device::PeerRole::kCandidate);
  if (prep_.joiner == self_)
    for (transport::MemberId l : prep_.leavers)
      if (!device.hasPeer(l))
        device.addPeer(l, prep_.leaverAddress, fmt::format("the leaving member {:016x} ({})", l, prep_.leaverAddress),
                       transport::Device::PeerRole::kCandidate);
}

// Opens what this member needs of the next view that it does not have: its
// ring neighbours there (every member where the view's collectives read
// each peer in place) and, for the leaver and the joiner, each other.
void Migration::prepareDelta(uint32_t nextEpoch) {
  std::vector<membership::ViewEntry> next;
  transport::MemberId joiner;
  std::vector<transport::MemberId> leavers;
  std::vector<std::pair<transport::MemberId, transport::Device::LinksUp>> linksAtAnnounce;
  {
    MutexLock lock(mu_);
    if (prep_.epoch != nextEpoch || prep_.state == ecclPrepareFailed) return;
    next = prep_.next;
    joiner = prep_.joiner;
    leavers = prep_.leavers;
    linksAtAnnounce = prep_.linksAtAnnounce;
  }
  std::vector<transport::MemberId> needed;
  int me = rankIn(next, self_);
  if (me >= 0) {
    std::vector<transport::MemberId> members;
    for (const auto& e : next) members.push_back(e.member);
    if (links_.readsEveryPeer && links_.readsEveryPeer(members)) {
      std::copy_if(members.begin(), members.end(), std::back_inserter(needed),
                   [this](transport::MemberId m) { return m != self_; });
    } else {
      for (int peer : coll::latencyPeers(me, static_cast<int>(next.size()))) needed.push_back(next[peer].member);
    }
  }
  bool isLeaver = std::count(leavers.begin(), leavers.end(), self_) > 0;
  if (isLeaver) needed.push_back(joiner);
  if (self_ == joiner) needed.insert(needed.end(), leavers.begin(), leavers.end());
  std::string failure;
  std::sort(needed.begin(), needed.end());
  needed.erase(std::unique(needed.begin(), needed.end()), needed.end());
  Prepared opened;
  try {
    transport::connectAll(*links_.device, needed, deadline());
    // Lanes between the joiner and the others are the delta, whichever side
    // dialed, unless they were up before (an eager standby).
    for (transport::MemberId m : needed) {
      if (m == self_ || (self_ != joiner && m != joiner)) continue;
      transport::Device::LinksUp had;
      for (const auto& [member, links] : linksAtAnnounce)
        if (member == m) had = links;
      transport::Device::LinksUp up = links_.device->linksUp(m);
      opened.connections += up.lanes > had.lanes ? up.lanes - had.lanes : 0;
      opened.queuePairs += up.queuePairs > had.queuePairs ? up.queuePairs - had.queuePairs : 0;
    }
  } catch (const Error& e) {
    failure = e.what();
    links_.report(self_ == joiner ? leavers.front() : joiner, fmt::format("preparing epoch {}: {}", nextEpoch, e.what()));
  }
  MutexLock lock(mu_);
  if (prep_.epoch != nextEpoch) return;
  if (!failure.empty()) {
    // Reported above: the coordinator aborts the preparation for everyone
    // with one reason (naming the joiner or the failed member), so all
    // members see the same FAILED.
    log::warn("rank {}: preparing epoch {}: {}", rank_.load(), nextEpoch, failure);
  } else {
    prep_.locallyPrepared = true;
    prep_.prepared = opened;
    prep_.prepared.ms = msSince(prep_.announced);
    links_.prepared(nextEpoch);
  }
  cv_.notifyAll();
}

// The lower member id dials, the other only has to know the peer.
void Migration::connectStandbys(const std::vector<membership::ViewEntry>& peers) {
  transport::Device& device = *links_.device;
  Deadline until = deadlineAfterMs(std::min<int64_t>(links_.timeoutMs, params::handshakeTimeoutMs()));
  for (const auto& e : peers) {
    if (e.member == self_) continue;
    if (!device.hasPeer(e.member))
      device.addPeer(e.member, e.address, fmt::format("member {:016x} ({})", e.member, transport::displayAddress(e.address)),
                     transport::Device::PeerRole::kCandidate);
  }
  for (const auto& e : peers) {
    if (e.member < self_) continue;  // it dials us
    try {
      device.connectNow(e.member, until);
    } catch (const Error& err) {
      log::info("eager connection to {:016x} not opened: {}", e.member, err.what());
    }
  }
}

void Migration::request(int rank) {
  {
    MutexLock lock(mu_);
    if (prep_.state == ecclPreparePreparing || prep_.state == ecclPrepareReady) {
      if (prep_.leavingRank == rank || prep_.epoch == 0) return;
      fail(ecclInvalidUsage, "ecclCommPrepare: rank {} is already being migrated", prep_.leavingRank);
    }
    prep_ = Preparation{};
    prep_.state = ecclPreparePreparing;
    prep_.leavingRank = rank;
  }
  links_.client->requestMigration(rank);
}

ecclPrepareState_t Migration::status(std::string* why, int* leavingRank) const {
  MutexLock lock(mu_);
  *why = prep_.why;
  *leavingRank = prep_.state == ecclPreparePreparing || prep_.state == ecclPrepareReady ? prep_.leavingRank : -1;
  return prep_.state;
}

void Migration::reset() {
  MutexLock lock(mu_);
  settledEpoch_ = std::max(settledEpoch_, prep_.epoch);
  prep_ = Preparation{};
}

// Once the coordinator has said READY, every member of the next view votes
// over the links the preparation opened and, on a unanimous yes, enters the
// next view on its own and only then tells the coordinator. A vote that
// misses someone asks the coordinator, which commits if any member saw yes
// and aborts if none did (docs/elastic.md, "Switchover").
Migration::Decision Migration::decide(const std::string& revoked) {
  const int rank = rank_;
  Decision d;
  uint32_t nextEpoch;
  transport::MemberId joiner;
  std::string story;
  {
    MutexLock lock(mu_);
    Deadline until = deadline();
    if (prep_.state == ecclPrepareNone)
      fail(ecclInvalidUsage, "ecclCommSwitchover (rank {}): no reconfiguration is being prepared", rank);
    while (prep_.state != ecclPrepareFailed && !(prep_.epoch != 0 && prep_.everyonePrepared)) {
      if (!cv_.waitUntil(mu_, until) && Clock::now() >= until)
        fail(ecclTimeout, "ecclCommSwitchover (rank {}): the members of epoch {} were not all prepared before the deadline",
             rank, prep_.epoch);
    }
    if (prep_.state == ecclPrepareFailed)
      fail(ecclRemoteError, "ecclCommSwitchover (rank {}): the preparation failed: {}", rank, prep_.why);
    nextEpoch = prep_.epoch;
    d.view.entries = prep_.next;
    d.leavers = prep_.leavers;
    d.prepared = prep_.prepared;
    story = prep_.why;
    joiner = prep_.joiner;
  }
  if (std::count(d.leavers.begin(), d.leavers.end(), self_)) {
    sendBoundaryToken();
    links_.client->requestSwitchover(nextEpoch);
    d.view = awaitDecision();
    d.leaving = true;
    d.agreed = Clock::now();
    reset();
    return d;
  }
  bool yes = revoked.empty();
  std::string why = revoked;
  if (self_ == joiner) {
    // The leaver's token: it has finished its last op of the old view.
    for (transport::MemberId l : d.leavers) {
      uint8_t token = 0;
      try {
        links_.device->wait(links_.device->irecv(l, boundaryTokenSeq(nextEpoch), 0, &token, 1), deadline(),
                            fmt::format("ecclCommSwitchover (joiner of rank {}), waiting for the leaver", rank));
      } catch (const Error& e) {
        yes = false;
        why = e.what();
      }
    }
  }
  yes = vote(d.view.entries, nextEpoch, yes, why.empty() ? &why : nullptr) && yes;
  d.view.epoch = nextEpoch;
  d.view.rank = rankIn(d.view.entries, self_);
  d.view.why = story;
  if (yes) {
    links_.client->reportSwitched(nextEpoch, d.view.rank == 0);  // the tree's root: one wakeup, not N
    d.agreed = Clock::now();
    return d;
  }
  links_.client->reportSwitchFailed(nextEpoch, why);
  // Committed: another member saw everyone vote yes, so the next view is
  // current, but a member of it is gone; the caller recovers from there.
  d.view = awaitDecision();
  d.agreed = Clock::now();
  d.missed = why;
  return d;
}

// A minimum up the next view's binary tree and the root's answer back down
// (2 log2 N hops), on links its preparation opened. A member whose child
// or parent is gone counts that as a no and still sends on (agreement
// traffic survives revocation), so every live member finishes; yes only if
// every member voted yes. A member that dies after sending its yes can
// leave a split (its subtree never hears the answer): the coordinator
// settles that.
bool Migration::vote(const std::vector<membership::ViewEntry>& next, uint32_t nextEpoch, bool yes, std::string* why) {
  transport::Device& device = *links_.device;
  const int n = static_cast<int>(next.size()), r = rankIn(next, self_);
  const coll::BinaryTree tree = coll::binaryTree(r, n);
  const uint64_t seq = voteSeq(nextEpoch);
  Deadline until = deadline();
  {
    MutexLock lock(mu_);
    prep_.voted = true;
  }
  uint8_t ballot = yes ? 1 : 0;
  auto lost = [&](const char* phase, int peer, const Error& e) {
    ballot = 0;
    if (why && why->empty())
      *why = fmt::format("switchover vote for epoch {} ({} rank {}): {}", nextEpoch, phase, peer, e.what());
  };
  uint8_t fromChildren[2] = {0, 0};
  transport::RequestPtr recvs[2];
  for (int c = 0; c < tree.childCount; ++c)
    recvs[c] = device.irecv(next[tree.children[c]].member, seq, kVoteUp, &fromChildren[c], 1);
  for (int c = 0; c < tree.childCount; ++c) {
    try {
      device.wait(recvs[c], until, "");
      ballot = std::min(ballot, fromChildren[c]);
    } catch (const Error& e) {
      lost("from child", tree.children[c], e);
    }
  }
  if (tree.parent >= 0) {
    transport::MemberId parent = next[tree.parent].member;
    uint8_t up = ballot, down = 0;
    auto recv = device.irecv(parent, seq, kVoteDown, &down, 1);
    try {
      device.wait(device.isend(parent, seq, kVoteUp, &up, 1), until, "");
    } catch (const Error&) {
      // A dead parent: the receive below fails too.
    }
    try {
      device.wait(recv, until, "");
      ballot = down;
    } catch (const Error& e) {
      lost("from parent", tree.parent, e);
    }
  }
  uint8_t decision = ballot;
  std::vector<transport::RequestPtr> sends;
  for (int c = 0; c < tree.childCount; ++c)
    sends.push_back(device.isend(next[tree.children[c]].member, seq, kVoteDown, &decision, 1));
  for (auto& s : sends) {
    try {
      device.wait(s, until, "");
    } catch (const Error&) {
      // A dead child: its own children hear no answer and count a no.
    }
  }
  if (why && why->empty() && !ballot) *why = fmt::format("a member voted no on epoch {} (it lost a peer)", nextEpoch);
  return ballot == 1;
}

// A no decides the vote, so nobody has to wait for the rest from this member.
void Migration::abstain() {
  std::vector<membership::ViewEntry> next;
  uint32_t nextEpoch;
  {
    MutexLock lock(mu_);
    if (!prep_.everyonePrepared || prep_.voted || prep_.state == ecclPrepareFailed || rankIn(prep_.next, self_) < 0)
      return;
    prep_.voted = true;
    next = prep_.next;
    nextEpoch = prep_.epoch;
  }
  transport::Device& device = *links_.device;
  static const uint8_t no = 0;
  const coll::BinaryTree tree = coll::binaryTree(rankIn(next, self_), static_cast<int>(next.size()));
  const uint64_t seq = voteSeq(nextEpoch);
  std::vector<transport::RequestPtr> sends;
  if (tree.parent >= 0) sends.push_back(device.isend(next[tree.parent].member, seq, kVoteUp, &no, 1));
  for (int c = 0; c < tree.childCount; ++c)
    sends.push_back(device.isend(next[tree.children[c]].member, seq, kVoteDown, &no, 1));
  for (auto& s : sends) {
    try {
      device.wait(s, deadline(), "");
    } catch (const Error&) {
      // That partner is gone; its own partners count it as a no.
    }
  }
}

// Sent at switchover, or when a leaver destroys its communicator without one.
void Migration::sendBoundaryToken() {
  uint32_t nextEpoch;
  transport::MemberId joiner;
  {
    MutexLock lock(mu_);
    bool leaver = std::count(prep_.leavers.begin(), prep_.leavers.end(), self_) > 0;
    if (!leaver || prep_.epoch == 0 || prep_.state == ecclPrepareFailed || prep_.tokenSent) return;
    prep_.tokenSent = true;
    nextEpoch = prep_.epoch;
    joiner = prep_.joiner;
  }
  static const uint8_t token = 1;
  try {
    links_.device->wait(links_.device->isend(joiner, boundaryTokenSeq(nextEpoch), 0, &token, 1), deadline(), "");
  } catch (const Error& e) {
    log::info("rank {}: the joiner did not take the boundary token: {}", rank_.load(), e.what());  // its vote fails
  }
}

// The coordinator's answer to a member that cannot tell the outcome alone
// (a no-voter, the leaver): the next view, or why the switchover aborted.
membership::ViewUpdate Migration::awaitDecision() {
  try {
    return links_.client->awaitView(deadline(), fmt::format("ecclCommSwitchover (rank {})", rank_.load()));
  } catch (const Error& e) {
    MutexLock lock(mu_);
    prep_.state = ecclPrepareFailed;
    prep_.why = e.what();
    throw Error(e.code() == ecclInvalidUsage ? ecclRemoteError : e.code(), e.what());
  }
}

void Migration::send(const void* buf, size_t bytes) {
  transport::MemberId joiner;
  const int rank = rank_;
  {
    MutexLock lock(mu_);
    // Asked for but not announced yet: the coordinator answers promptly.
    Deadline until = deadline();
    while (prep_.state == ecclPreparePreparing && prep_.epoch == 0)
      if (!cv_.waitUntil(mu_, until) && Clock::now() >= until)
        fail(ecclTimeout, "ecclMigrationSend (rank {}): the migration was not announced before the deadline", rank);
    bool leaver = std::count(prep_.leavers.begin(), prep_.leavers.end(), self_) > 0;
    if (prep_.epoch == 0 || prep_.state == ecclPrepareFailed || !leaver)
      fail(ecclInvalidUsage, "ecclMigrationSend (rank {}): this member is not the leaver of a migration being prepared{}{}",
           rank, prep_.state == ecclPrepareFailed ? ": " : "", prep_.state == ecclPrepareFailed ? prep_.why : "");
    joiner = prep_.joiner;
  }
  uint64_t seq = transport::FrameHeader::kP2pBit | kMigrationBit | ++sendSeq_;
  auto r = links_.device->isend(joiner, seq, 0, buf, bytes);
  links_.device->wait(r, deadline(), fmt::format("ecclMigrationSend (rank {} to its joiner)", rank));
}

void Migration::recv(void* buf, size_t bytes) {
  transport::MemberId leaver;
  {
    MutexLock lock(mu_);
    if (prep_.epoch == 0 || prep_.state == ecclPrepareFailed || prep_.joiner != self_ || prep_.leavers.empty())
      fail(ecclInvalidUsage, "ecclMigrationRecv: this member is not the joiner of a migration being prepared{}{}",
           prep_.state == ecclPrepareFailed ? ": " : "", prep_.state == ecclPrepareFailed ? prep_.why : "");
    leaver = prep_.leavers[0];
  }
  uint64_t seq = transport::FrameHeader::kP2pBit | kMigrationBit | ++recvSeq_;
  auto r = links_.device->irecv(leaver, seq, 0, buf, bytes);
  links_.device->wait(r, deadline(), fmt::format("ecclMigrationRecv (joiner of rank {})", rank_.load()));
}

}  // namespace eccl::elastic
