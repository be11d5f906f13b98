#include "membership/coord_client.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "membership/coord_channel.h"
#include "membership/handshake.h"
#include "common/error.h"
#include "common/log.h"

namespace eccl::membership {

CoordClient::CoordClient(const UniqueIdData& id, const JoinRequest& join, int64_t heartbeatMs,
                         int64_t heartbeatTimeoutMs, Deadline deadline)
    : self_(join.member),
      id_(id),
      failoverMs_(join.failoverMs),
      coordinator_(coordinatorLabel(id)),
      heartbeatMs_(heartbeatMs),
      heartbeatTimeoutMs_(heartbeatTimeoutMs) {
  std::string what = fmt::format("{} joining {}",
                                 join.role == Role::kRank ? fmt::format("rank {}", join.rank) : "standby", coordinator_);
  join_.kind = CoordKind::kJoin;
  join_.role = join.role;
  join_.rank = join.rank;
  join_.nranks = static_cast<uint32_t>(join.nranks);
  join_.member = join.member;
  join_.pid = static_cast<uint64_t>(getpid());
  join_.address = join.dataAddress;
  join_.policy = join.eager ? 1 : 0;
  channel_ = openFirst(deadline, what);
  wakeFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wakeFd_ < 0) fail(ecclSystemError, "eventfd: {}", strerror(errno));
  thread_ = std::thread([this] {
    run();
    releaseThreadCryptoState();
  });
}

std::unique_ptr<SealedChannel> CoordClient::open(const CoordMessage& join, Deadline deadline,
                                                 const std::string& what) {
  Fd fd = connectToCoordinator(id_, deadline, what);
  Hello hello{Purpose::kBootstrap, id_.jobId, join.member, 0, 0};
  Secret key;
  authenticateAsClient(fd.get(), id_.secret, hello, deadline, what, &key);
  auto channel = std::make_unique<SealedChannel>(std::move(fd), key, false, coordinator_);
  channel->send(join, deadline);
  return channel;
}

std::unique_ptr<SealedChannel> CoordClient::openFirst(Deadline deadline, const std::string& what) {
  for (;;) {
    try {
      return open(join_, deadline, what);
    } catch (const Error& e) {
      if (failoverMs_ <= 0 || e.code() == ecclAuthError || Clock::now() >= deadline) throw;
      log::info("{}: {}; trying again", what, e.what());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// The coordinator answers a resume with the view it holds: one of the
// epoch this member is in acknowledges it (nothing was missed, so a request
// it had sent is asked again in case it was lost with the old coordinator);
// a newer one is news, delivered as any view.
bool CoordClient::resume(std::string* why) {
  const Deadline until = deadlineAfterMs(failoverMs_);
  CoordMessage join = join_;
  join.uuid = kJoinResuming;
  std::optional<CoordMessage> ask, reconfig;
  {
    MutexLock lock(mu_);
    join.epoch = epoch_;
    ask = unanswered_;
    reconfig = reconfigSaid_;
  }
  std::string what = fmt::format("member {:016x} resuming with {}", self_, coordinator_);
  bool afresh = false;
  while (Clock::now() < until) {
    bool placed;
    {
      MutexLock lock(mu_);
      if (stopping_) return false;
      placed = placed_;
    }
    try {
      auto channel = open(join, std::min(until, deadlineAfterMs(1000)), what);
      if (afresh) {
        // Its answer (a standby's view, a rank's first view at formation)
        // comes in the usual way, as would a refusal.
        channel_ = std::move(channel);
        if (ask) channel_->send(*ask, deadlineAfterMs(heartbeatTimeoutMs_));
        log::info("member {:016x}: joined {} afresh", self_, coordinator_);
        return true;
      }
      CoordMessage first = channel->receive(std::min(until, deadlineAfterMs(heartbeatTimeoutMs_)));
      if (first.kind == CoordKind::kError && first.policy == kErrorMemberUnknown && !placed) {
        log::warn("member {:016x}: {} holds no record of its admission (its predecessor died before replicating "
                  "it); joining afresh", self_, coordinator_);
        join = join_;
        what = fmt::format("member {:016x} joining {} afresh", self_, coordinator_);
        afresh = true;
        continue;
      }
      if (first.kind == CoordKind::kError) {
        *why = fmt::format("{} refused the resume: {}", coordinator_, first.text);
        return false;
      }
      if (first.kind == CoordKind::kView && !takeView(&held_, &first, why)) return false;
      channel_ = std::move(channel);
      log::info("member {:016x}: resumed with {} (epoch {})", self_, coordinator_, first.epoch);
      if (first.kind != CoordKind::kView || first.epoch != join.epoch) {
        deliver(std::move(first));
      } else {
        if (reconfig) channel_->send(*reconfig, deadlineAfterMs(heartbeatTimeoutMs_));
        if (ask) channel_->send(*ask, deadlineAfterMs(heartbeatTimeoutMs_));
      }
      return true;
    } catch (const Error& e) {
      *why = e.what();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  *why = fmt::format("no coordinator took the member back within {} ms (last: {})", failoverMs_, *why);
  return false;
}

CoordClient::~CoordClient() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wakeFd_, &one, 8);
  if (thread_.joinable()) thread_.join();
  ::close(wakeFd_);
}

void CoordClient::setCallbacks(Callbacks callbacks) {
  std::optional<CoordMessage> early;
  std::vector<CoordMessage> earlyReconfig;
  std::optional<std::vector<ViewEntry>> earlyStandbyView;
  Callbacks cb;
  {
    MutexLock lock(mu_);
    callbacks_ = std::move(callbacks);
    cb = callbacks_;
    early.swap(failedBeforeCallbacks_);
    earlyReconfig.swap(reconfigBeforeCallbacks_);
    for (const auto& q : answers_)  // the standby view that came before the callbacks
      if (q.kind == CoordKind::kView && q.rank < 0) earlyStandbyView = q.entries;
  }
  if (earlyStandbyView && cb.onStandbyView) cb.onStandbyView(*earlyStandbyView);
  if (early && cb.onFailed) cb.onFailed(*early);
  for (auto& m : earlyReconfig)
    if (cb.onReconfiguration) cb.onReconfiguration(m);
}

void CoordClient::post(CoordMessage m, bool wake) {
  {
    MutexLock lock(mu_);
    if (m.kind == CoordKind::kRecover || m.kind == CoordKind::kGrow || m.kind == CoordKind::kReconfigure)
      unanswered_ = m;
    if (m.kind == CoordKind::kPrepared || m.kind == CoordKind::kSwitchover || m.kind == CoordKind::kSwitched ||
        m.kind == CoordKind::kSwitchFailed)
      reconfigSaid_ = m;
    if (m.kind == CoordKind::kSwitched) epoch_ = std::max(epoch_, m.epoch);  // it entered that view
    outbox_.push_back(std::move(m));
  }
  if (!wake) return;
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wakeFd_, &one, 8);
}

void CoordClient::report(uint64_t failedMember, const std::string& reason, uint64_t neededFrom, uint32_t epoch,
                         bool itClosedOnUs) {
  CoordMessage m;
  m.kind = CoordKind::kReport;
  m.epoch = epoch;
  m.policy = itClosedOnUs ? kReportPeerClosed : 0;
  m.members = {failedMember};
  m.neededFrom = {neededFrom};
  m.text = reason.substr(0, kMaxCoordText);
  post(std::move(m));
}

void CoordClient::joinGroup(uint64_t uuid) { postGroup(uuid, /*leave=*/false); }
void CoordClient::leaveGroup(uint64_t uuid) { postGroup(uuid, /*leave=*/true); }

void CoordClient::postGroup(uint64_t uuid, bool leave) {
  CoordMessage m;
  m.kind = CoordKind::kGroup;
  m.uuid = uuid;
  m.policy = leave ? 1 : 0;
  post(std::move(m));
}

void CoordClient::requestRecover(uint32_t epoch, uint32_t policy) {
  CoordMessage m;
  m.kind = CoordKind::kRecover;
  m.epoch = epoch;
  m.policy = policy;
  post(std::move(m));
}

void CoordClient::requestGrow(uint32_t epoch, uint32_t count) {
  CoordMessage m;
  m.kind = CoordKind::kGrow;
  m.epoch = epoch;
  m.nranks = count;
  post(std::move(m));
}

void CoordClient::requestReconfigure(uint32_t epoch, uint64_t uuid, const std::vector<uint64_t>& members) {
  CoordMessage m;
  m.kind = CoordKind::kReconfigure;
  m.epoch = epoch;
  m.uuid = uuid;
  m.members = members;
  post(std::move(m));
}

void CoordClient::requestMigration(int rank) {
  CoordMessage m;
  m.kind = CoordKind::kMigrate;
  m.rank = rank;
  post(std::move(m));
}

void CoordClient::prepared(uint32_t nextEpoch) {
  CoordMessage m;
  m.kind = CoordKind::kPrepared;
  m.epoch = nextEpoch;
  post(std::move(m));
}

void CoordClient::requestSwitchover(uint32_t nextEpoch) {
  CoordMessage m;
  m.kind = CoordKind::kSwitchover;
  m.epoch = nextEpoch;
  post(std::move(m));
}

// The coordinator needs one yes to commit (releasing the leaver and
// settling a split vote), so one member sends it at once; the others' go
// with their next message or heartbeat, so no more threads wake while the
// job restarts. Every later message of this member still follows it.
void CoordClient::reportSwitched(uint32_t nextEpoch, bool urgent) {
  CoordMessage m;
  m.kind = CoordKind::kSwitched;
  m.epoch = nextEpoch;
  post(std::move(m), urgent);
}

void CoordClient::reportSwitchFailed(uint32_t nextEpoch, const std::string& why) {
  CoordMessage m;
  m.kind = CoordKind::kSwitchFailed;
  m.epoch = nextEpoch;
  m.text = why.substr(0, kMaxCoordText);
  post(std::move(m));
}

void CoordClient::leave() {
  CoordMessage m;
  m.kind = CoordKind::kLeave;
  post(std::move(m));
  // Give the thread a moment to put it on the wire before we close.
  MutexLock lock(mu_);
  Deadline until = deadlineAfterMs(500);
  while (!outbox_.empty() && !lost_ && cv_.waitUntil(mu_, until)) {
  }
}

void CoordClient::interrupt(const std::string& why) {
  MutexLock lock(mu_);
  if (!interrupted_) interrupted_ = why;
  cv_.notifyAll();
}

bool CoordClient::evicted() const {
  MutexLock lock(mu_);
  return evicted_.has_value();
}

ViewUpdate CoordClient::awaitView(Deadline deadline, const std::string& what) {
  MutexLock lock(mu_);
  for (;;) {
    if (!answers_.empty()) {
      CoordMessage m = std::move(answers_.front());
      answers_.pop_front();
      if (m.kind == CoordKind::kError) fail(ecclInvalidUsage, "{}: {} refused: {}", what, coordinator_, m.text);
      ViewUpdate v;
      v.epoch = m.epoch;
      v.rank = static_cast<int>(m.rank);
      v.entries = std::move(m.entries);
      v.why = std::move(m.text);
      v.joining = m.kind == CoordKind::kPrepare;
      v.leavers = std::move(m.members);
      v.uuid = m.uuid;
      return v;
    }
    if (evicted_) fail(ecclEvicted, "{}: evicted by {}: {}", what, coordinator_, *evicted_);
    if (interrupted_) fail(ecclRemoteError, "{}: interrupted: {}", what, *interrupted_);
    if (lost_) fail(ecclRemoteError, "{}: lost {}: {}", what, coordinator_, *lost_);
    if (!cv_.waitUntil(mu_, deadline) && Clock::now() >= deadline)
      fail(ecclTimeout, "{}: no answer from {} before the deadline", what, coordinator_);
  }
}

// Callbacks run without our lock: they call into the device, which may call
// report() on this client.
void CoordClient::deliver(CoordMessage m) {
  Callbacks cb;
  {
    MutexLock lock(mu_);
    if (m.kind == CoordKind::kView || m.kind == CoordKind::kError) {
      unanswered_.reset();
      if (m.kind == CoordKind::kView) epoch_ = m.epoch;
      if (m.kind == CoordKind::kView && m.rank >= 0) placed_ = true;
      if (reconfigSaid_ && (m.kind == CoordKind::kError || m.epoch >= reconfigSaid_->epoch)) reconfigSaid_.reset();
      // An idle standby hears of every view change; only the latest of
      // those rankless views matters, so they do not pile up unread.
      bool standbyView = m.kind == CoordKind::kView && m.rank < 0;
      if (standbyView)
        std::erase_if(answers_, [](const CoordMessage& q) { return q.kind == CoordKind::kView && q.rank < 0; });
      answers_.push_back(m);
      cv_.notifyAll();
      if (!standbyView || !callbacks_.onStandbyView) return;
      cb = callbacks_;
    }
    if (m.kind == CoordKind::kView) {
      cb.onStandbyView(m.entries);
      return;
    }
    if (m.kind == CoordKind::kFailed && !callbacks_.onFailed) {
      failedBeforeCallbacks_ = m;
      return;
    }
    if (m.kind == CoordKind::kPrepareFailed && reconfigSaid_ && reconfigSaid_->epoch == m.epoch) reconfigSaid_.reset();
    if (m.kind == CoordKind::kPrepare && m.member == self_) placed_ = true;
    bool reconfig = m.kind == CoordKind::kPrepare || m.kind == CoordKind::kPrepareReady ||
                    m.kind == CoordKind::kPrepareFailed || m.kind == CoordKind::kStandbys;
    if (reconfig && !callbacks_.onReconfiguration) {
      reconfigBeforeCallbacks_.push_back(std::move(m));
      return;
    }
    if (m.kind == CoordKind::kEvicted) {
      evicted_ = m.text;
      log::warn("evicted by {}: {}", coordinator_, m.text);
      cv_.notifyAll();
    }
    cb = callbacks_;
  }
  switch (m.kind) {
    case CoordKind::kFailed:
      if (cb.onFailed) cb.onFailed(m);
      break;
    case CoordKind::kGroupFailed:
      if (cb.onGroupFailed) cb.onGroupFailed(m);
      break;
    case CoordKind::kEvicted:
      if (cb.onEvicted) cb.onEvicted(m.text);
      break;
    case CoordKind::kPrepare:
      if (cb.onReconfiguration) cb.onReconfiguration(m);
      // A standby chosen as the joiner returns from its wait only after
      // its communicator has recorded the preparation.
      if (m.member == self_) {
        MutexLock lock(mu_);
        answers_.push_back(std::move(m));
        cv_.notifyAll();
      }
      break;
    case CoordKind::kPrepareReady:
    case CoordKind::kPrepareFailed:
    case CoordKind::kStandbys:
      if (cb.onReconfiguration) cb.onReconfiguration(m);
      break;
    default:
      log::warn("{} sent an unexpected {} message", coordinator_, coordKindName(m.kind));
  }
}

void CoordClient::run() {
  auto lastHeard = Clock::now();
  auto nextBeat = Clock::now();
  auto lose = [&](std::string why) {
    if (failoverMs_ > 0) {
      log::warn("member {:016x}: lost {}: {}; looking for its successor for up to {} ms", self_, coordinator_, why,
                failoverMs_);
      if (resume(&why)) {
        lastHeard = Clock::now();
        nextBeat = Clock::now();
        return;
      }
    }
    MutexLock lock(mu_);
    if (!lost_) lost_ = why;
    cv_.notifyAll();
  };
  for (;;) {
    std::deque<CoordMessage> out;
    {
      MutexLock lock(mu_);
      if (stopping_) return;
      out.swap(outbox_);
    }
    try {
      while (!out.empty()) {
        channel_->send(out.front(), deadlineAfterMs(heartbeatTimeoutMs_));
        out.pop_front();
      }
      if (Clock::now() >= nextBeat) {
        CoordMessage beat;
        beat.kind = CoordKind::kHeartbeat;
        channel_->send(beat, deadlineAfterMs(heartbeatTimeoutMs_));
        nextBeat = Clock::now() + std::chrono::milliseconds(heartbeatMs_);
      }
    } catch (const Error& e) {
      {
        MutexLock lock(mu_);  // what did not go goes to a successor, in order
        outbox_.insert(outbox_.begin(), std::make_move_iterator(out.begin()), std::make_move_iterator(out.end()));
      }
      lose(e.what());
    }
    {
      MutexLock lock(mu_);
      cv_.notifyAll();  // leave() waits for the outbox to empty
      if (lost_) {
        // Keep the thread for shutdown only; nothing more can arrive.
        while (!stopping_) cv_.waitUntil(mu_, deadlineAfterMs(100));
        return;
      }
    }
    pollfd fds[2] = {{channel_->fd(), POLLIN, 0}, {wakeFd_, POLLIN, 0}};
    int wait = static_cast<int>(std::clamp<int64_t>(msUntil(nextBeat), 0, heartbeatMs_));
    int n = ::poll(fds, 2, wait);
    if (n > 0 && (fds[1].revents & POLLIN)) {
      uint64_t drained;
      [[maybe_unused]] ssize_t r = ::read(wakeFd_, &drained, 8);
    }
    std::vector<CoordMessage> got;
    bool open = true;
    std::string failure;
    if (n > 0 && fds[0].revents) {
      try {
        open = channel_->drain(&got);
      } catch (const Error& e) {
        failure = e.what();
      }
      lastHeard = Clock::now();
    }
    // What came before a reset is delivered first: a coordinator that
    // evicts a member closes on it, and the view or eviction it sent last
    // must not be lost to the reset.
    for (auto& m : got) {
      if (m.kind == CoordKind::kView) {
        std::string why;
        if (!takeView(&held_, &m, &why)) {
          failure = fmt::format("{}: {}", coordinator_, why);
          break;  // nothing after it is understood either
        }
      }
      if (m.kind != CoordKind::kHeartbeat) deliver(std::move(m));
    }
    if (!failure.empty()) {
      lose(failure);
      continue;
    }
    if (!open) {
      lose("the coordinator closed the connection");
      continue;
    }
    if (Clock::now() - lastHeard > std::chrono::milliseconds(heartbeatTimeoutMs_))
      lose(fmt::format("no heartbeat from the coordinator for {} ms", heartbeatTimeoutMs_));
  }
}

}  // namespace eccl::membership
