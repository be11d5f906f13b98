#include "membership/coordinator.h"

#include <poll.h>
#include <sys/epoll.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "membership/coord_channel.h"
#include "membership/coordinator/core.h"
#include "membership/handshake.h"
#include "membership/handshake_gate.h"
#include "membership/state_writer.h"
#include "common/error.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/netif.h"
#include "common/params.h"

namespace eccl::membership {

struct Coordinator::State {
  UniqueIdData id;
  Fd listenFd;
  CoordinatorOptions opt;
};

Coordinator::Coordinator(const UniqueIdData& id, Fd listenFd, const CoordinatorOptions& options)
    : state_(std::make_unique<State>()) {
  state_->id = id;
  state_->listenFd = std::move(listenFd);
  state_->opt = options;
  thread_ = std::thread([this] {
    try {
      run();
    } catch (const std::exception& e) {
      log::warn("coordinator stopped: {}", e.what());
    }
    stopped_ = !stopping_;
    releaseThreadCryptoState();
  });
}

std::set<uint64_t> Coordinator::idleStandbyPids() const {
  MutexLock lock(snapshotMu_);
  return idleStandbyPids_;
}

std::set<uint64_t> Coordinator::viewPids() const {
  MutexLock lock(snapshotMu_);
  return viewPids_;
}

std::set<uint64_t> Coordinator::fencedPids() const {
  MutexLock lock(snapshotMu_);
  return fencedPids_;
}

Coordinator::~Coordinator() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
}

namespace {

// A connection past the handshake. Until its first message it belongs to
// nobody (firstBy bounds the wait); then to its member, or to a tool,
// which is answered and closed. What the core sends is queued and written
// as the socket takes it, so a member that reads slowly or not at all
// delays nobody: past kMaxQueuedBytes it is unreachable, and its silence
// declares it.
struct Connection {
  std::unique_ptr<SealedChannel> channel;
  bool joined = false;
  bool closing = false;  // its last message is queued: closed once that went, or at `deadline`
  bool wantsOut = false;  // registered for EPOLLOUT
  Deadline deadline;
};

constexpr size_t kMaxQueuedBytes = 16u << 20;  // a few hundred views of 4,096 members
constexpr int64_t kLastMessageMs = 1000;      // an answer or eviction before the connection closes

class Driver {
 public:
  Driver(const UniqueIdData& id, int listenFd, const CoordinatorOptions& opt)
      : opt_(opt), core_(opt), gate_(id.secret, id.jobId, gateOptions(opt), "coordinator") {
    gate_.addListener(listenFd, [listenFd](std::string* from) {
      SockAddr peer;
      Fd fd = acceptUntil(listenFd, Clock::now(), &peer);
      if (fd) *from = peer.str();
      return fd;
    });
    epoll_ = Fd(epoll_create1(EPOLL_CLOEXEC));
    if (!epoll_) fail(ecclSystemError, "coordinator: epoll_create1: {}", strerror(errno));
    if (!opt.takeOver.empty()) core_.importState(opt.takeOver, Clock::now());
    if (opt.replicate) writer_ = std::make_unique<StateWriter>(opt.replicate);
  }


  const CoordinatorCore& core() const { return core_; }

  // One round: waits for the sockets or the next deadline, then handles
  // everything that is ready. False: replication says this coordinator no
  // longer leads, and nothing of the round was carried out.
  bool runOnce() {
    std::vector<pollfd> fds;
    gate_.pollSet(&fds);
    const size_t gateCount = fds.size();
    if (writer_) fds.push_back({writer_->wakeFd(), POLLIN, 0});
    fds.push_back({epoll_.get(), POLLIN, 0});
    int n = ::poll(fds.data(), fds.size(), gate_.msUntilNextDeadline(msUntilWake()));
    if (n < 0 && errno != EINTR) fail(ecclSystemError, "coordinator poll(): {}", strerror(errno));
    if (n < 0)
      for (auto& f : fds) f.revents = 0;
    if (writer_ && fds[gateCount].revents) writer_->drainWake();
    // Joins first: a member's join was sent before anyone could learn of
    // it, so it must be handled before the messages of members that name
    // it (a reconfiguration that lists a new standby).
    std::vector<Admitted> admitted;
    gate_.service(fds.data(), gateCount, &admitted);
    for (Admitted& a : admitted) admit(std::move(a));
    if (fds.back().revents) serveReady();
    expire();
    core_.onTick(Clock::now());
    const bool changed = core_.takeStateChanged();
    std::vector<CoordAction> actions = core_.takeActions();
    if (!writer_) {
      carryOut(std::move(actions));
      return true;
    }
    // Replicated: what a round announces waits until the state it follows
    // from is durable, and messages to a member keep their order, so a
    // round's actions wait behind every round before them still waiting.
    // The state is exported only when no write is in flight: each export
    // walks every member, and exporting every round (thousands of members
    // each asking to recover, one round apiece) kept the loop from reading
    // their heartbeats; a round meanwhile waits for the next write.
    if (changed) unexported_ = true;
    if (unexported_ && writer_->written() >= changes_) {
      writer_->write(++changes_, core_.exportState());
      unexported_ = false;
    }
    if (writer_->lost()) {
      held_.clear();
      conns_.clear();
      timed_.clear();
      return false;
    }
    const uint64_t needs = changes_ + (unexported_ ? 1 : 0);
    if (changed || !held_.empty()) held_.push_back({needs, std::move(actions)});
    else carryOut(std::move(actions));
    const uint64_t written = writer_->written();
    while (!held_.empty() && held_.front().first <= written) {
      carryOut(std::move(held_.front().second));
      held_.pop_front();
    }
    return true;
  }

 private:
  static GateOptions gateOptions(const CoordinatorOptions& opt) {
    GateOptions g;
    g.handshakeTimeoutMs = opt.handshakeTimeoutMs;
    g.maxPending = opt.maxUnauthenticated;
    return g;
  }

  int msUntilWake() const {
    Deadline wake = core_.nextWake();
    for (uint64_t id : timed_) wake = std::min(wake, conns_.at(id).deadline);
    return static_cast<int>(std::clamp<int64_t>(msUntil(wake), 0, 100));
  }

  void admit(Admitted a) {
    const uint64_t id = nextConn_++;
    Connection c;
    c.channel = std::make_unique<SealedChannel>(std::move(a.fd), a.sessionKey, true, a.from);
    c.deadline = deadlineAfterMs(opt_.handshakeTimeoutMs);
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.u64 = id;
    if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, c.channel->fd(), &e) != 0)
      return log::warn("coordinator: epoll_ctl for {}: {}", a.from, strerror(errno));
    conns_[id] = std::move(c);
    timed_.insert(id);
    serve(id);  // the first message may have come with the handshake's end
  }

  void serveReady() {
    epoll_event events[256];
    int n = epoll_wait(epoll_.get(), events, 256, 0);
    std::vector<uint64_t> later;
    for (int i = 0; i < n; ++i) {
      const uint64_t id = events[i].data.u64;
      auto it = conns_.find(id);
      if (it == conns_.end()) continue;
      if (events[i].events & EPOLLOUT) flush(id, it->second);  // may close it
      it = conns_.find(id);
      if (it == conns_.end() || !(events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))) continue;
      if (it->second.joined) later.push_back(id);  // after the joins (above)
      else serve(id);
    }
    for (uint64_t id : later) serve(id);
  }

  void serve(uint64_t id) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    Connection& c = it->second;
    std::vector<CoordMessage> got;
    bool open = true;
    std::string error;
    try {
      open = c.channel->drain(&got);  // never blocks
    } catch (const Error& e) {
      error = e.what();
    }
    if (c.closing) {  // nothing it says matters now
      if (!open || !error.empty()) close(id);
      return;
    }
    size_t from = 0;
    if (!c.joined) {
      std::string why = !error.empty() ? error : !open ? "closed before its first message" : "";
      if (got.empty() && why.empty()) return;
      if (!got.empty()) {
        const CoordMessage& first = got.front();
        if (first.kind != CoordKind::kJoin && first.kind != CoordKind::kStatusQuery &&
            first.kind != CoordKind::kMigrate && first.kind != CoordKind::kRankExited)
          why = fmt::format("first message is {}, expected join", coordKindName(first.kind));
      }
      if (!why.empty()) {
        log::warn("coordinator rejected connection from {}: {}", c.channel->peer(), why);
        return close(id);
      }
      c.joined = true;
      timed_.erase(id);
      core_.onFirstMessage(id, c.channel->peer(), got.front(), Clock::now());
      if (got.front().kind == CoordKind::kJoin)  // its errors name the member from here on
        c.channel->setPeer(fmt::format("member {:016x} ({})", got.front().member, c.channel->peer()));
      from = 1;
    }
    for (size_t k = from; k < got.size(); ++k) {
      // A bug in handling one message must not take the job's only
      // coordinator down with it: the message is dropped, loudly.
      try {
        core_.onMessage(id, got[k], Clock::now());
      } catch (const std::exception& e) {
        log::warn("coordinator: internal error handling a {} message from {} (dropped): {}",
                  coordKindName(got[k].kind), c.channel->peer(), e.what());
      }
    }
    if (!error.empty() || !open) {
      core_.onClosed(id, error, Clock::now());
      close(id);
    }
  }

  // Carries out what the core decided, in order.
  void carryOut(std::vector<CoordAction> actions) {
    const CoordMessage* encodedFrom = nullptr;
    EncodedMessage encoded;
    for (CoordAction& a : actions) {
      auto it = conns_.find(a.conn);
      if (it == conns_.end() || it->second.closing) continue;
      Connection& c = it->second;
      if (a.kind == CoordAction::Kind::kClose) {
        close(a.conn);
        continue;
      }
      // A broadcast's actions share their message: encoded and hashed once.
      if (a.message.get() != encodedFrom) {
        encoded = encodeForSealing(*a.message);
        encodedFrom = a.message.get();
      }
      if (!c.channel->enqueue(encoded, kMaxQueuedBytes)) {
        if (!a.quiet)
          log::warn("coordinator: {} has not read {} bytes of messages; nothing more is sent to it",
                    c.channel->peer(), c.channel->queuedBytes());
        core_.onUnreachable(a.conn);
        if (a.kind == CoordAction::Kind::kSendAndClose) close(a.conn);
        continue;
      }
      if (a.kind == CoordAction::Kind::kSendAndClose) {
        c.closing = true;
        c.deadline = deadlineAfterMs(kLastMessageMs);
        timed_.insert(a.conn);
      }
      flush(a.conn, c);
    }
  }

  void flush(uint64_t id, Connection& c) {
    try {
      c.channel->flush();
    } catch (const Error& e) {
      // Broken: its end of file (or silence) will declare its member.
      if (!c.closing) log::warn("coordinator: {}", e.what());
      core_.onUnreachable(id);
      if (c.closing) return close(id);
    }
    const bool wantsOut = c.channel->queuedBytes() > 0;
    if (c.closing && !wantsOut) return close(id);
    if (wantsOut == c.wantsOut) return;
    c.wantsOut = wantsOut;
    epoll_event e{};
    e.events = wantsOut ? (EPOLLIN | EPOLLOUT) : EPOLLIN;
    e.data.u64 = id;
    epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.channel->fd(), &e);
  }

  void expire() {
    std::vector<uint64_t> expired;
    for (uint64_t id : timed_) {
      const Connection& c = conns_.at(id);
      if (Clock::now() < c.deadline) continue;
      if (!c.joined)
        log::warn("coordinator rejected connection from {}: no first message within {} ms of the handshake",
                  c.channel->peer(), opt_.handshakeTimeoutMs);
      expired.push_back(id);
    }
    for (uint64_t id : expired) close(id);
  }

  // The descriptor leaves the epoll set when it closes.
  void close(uint64_t id) {
    conns_.erase(id);
    timed_.erase(id);
  }

  CoordinatorOptions opt_;
  CoordinatorCore core_;
  HandshakeGate gate_;
  Fd epoll_;
  std::map<uint64_t, Connection> conns_;
  std::set<uint64_t> timed_;  // those with a deadline: not yet joined, or closing
  uint64_t nextConn_ = 1;
  std::unique_ptr<StateWriter> writer_;  // when replicated
  uint64_t changes_ = 0;                 // state changes handed to the writer
  std::deque<std::pair<uint64_t, std::vector<CoordAction>>> held_;  // rounds waiting for their state's write
  bool unexported_ = false;  // the state changed since the last export
};

}  // namespace

void Coordinator::run() {
  State& s = *state_;
  // Connections are admitted beside the members' service, never inline:
  // a silent or hostile one occupies a gate slot, not this loop.
  Driver driver(s.id, s.listenFd.get(), s.opt);
  auto refreshedPids = Clock::now() - std::chrono::seconds(1);
  auto pidsKey = driver.core().pidsKey();
  while (!stopping_) {
    if (!driver.runOnce()) {
      log::warn("coordinator: no longer the job's leader; stopped serving");
      break;
    }
    // This thread may live until the process exits (ecclGetUniqueId): keep
    // no OpenSSL per-thread state between rounds, so nothing is left behind.
    releaseThreadCryptoState();
    // The launcher's view of the pids, refreshed when the membership
    // changed (at most every 10 ms: thousands of members join or leave one
    // round each) and at least every 100 ms: walking every member each
    // round cost most of the loop's time at thousands of members.
    const auto sinceRefresh = Clock::now() - refreshedPids;
    if ((driver.core().pidsKey() != pidsKey && sinceRefresh >= std::chrono::milliseconds(10)) ||
        sinceRefresh >= std::chrono::milliseconds(100)) {
      pidsKey = driver.core().pidsKey();
      auto idle = driver.core().idleStandbyPids();
      auto inView = driver.core().viewPids();
      auto fenced = driver.core().fencedPids();
      MutexLock lock(snapshotMu_);
      idleStandbyPids_ = std::move(idle);
      viewPids_ = std::move(inView);
      fencedPids_ = std::move(fenced);
      refreshedPids = Clock::now();
    }
  }
}

std::unique_ptr<Coordinator> createJob(ecclUniqueId* id) {
  UniqueIdData d;
  randomBytes(d.secret.data(), d.secret.size());
  randomBytes(&d.jobId, sizeof(d.jobId));
  NetInterface ni = pickInterface(params::socketIfname());
  auto [fd, bound] = listenOn(ni.addr);
  d.root = bound;
  *id = encodeUniqueId(d);
  return std::make_unique<Coordinator>(d, std::move(fd), coordinatorOptionsFromEnv());
}

ecclUniqueId createUniqueId() {
  static Mutex mu;
  static std::vector<std::unique_ptr<Coordinator>> kept;
  ecclUniqueId id;
  auto c = createJob(&id);
  MutexLock lock(mu);
  kept.push_back(std::move(c));
  return id;
}

CoordinatorOptions coordinatorOptionsFromEnv() {
  CoordinatorOptions o;
  o.heartbeatMs = params::heartbeatMs();
  o.heartbeatTimeoutMs = params::heartbeatTimeoutMs();
  o.handshakeTimeoutMs = params::handshakeTimeoutMs();
  o.maxUnauthenticated = static_cast<size_t>(params::maxUnauthenticated());
  o.replaceWaitMs = params::replaceWaitMs();
  return o;
}

namespace {

std::string toolRequest(const UniqueIdData& id, CoordMessage q, Deadline deadline, const std::string& what) {
  Fd fd = connectToCoordinator(id, deadline, what);
  Hello hello{Purpose::kBootstrap, id.jobId, 0, 0, 0};
  Secret key;
  authenticateAsClient(fd.get(), id.secret, hello, deadline, what, &key);
  SealedChannel ch(std::move(fd), key, false, "the coordinator");
  q.role = Role::kTool;
  ch.send(q, deadline);
  CoordMessage answer = ch.receive(deadline);
  if (answer.kind == CoordKind::kError) fail(ecclInvalidUsage, "{}: refused: {}", what, answer.text);
  if (answer.kind != CoordKind::kStatus) fail(ecclRemoteError, "{}: answered with {}", what, coordKindName(answer.kind));
  return answer.text;
}

}  // namespace

std::string queryCoordinatorStatus(const UniqueIdData& id, Deadline deadline) {
  CoordMessage q;
  q.kind = CoordKind::kStatusQuery;
  return toolRequest(id, q, deadline, "status query to " + coordinatorLabel(id));
}

std::string reportRankExited(const UniqueIdData& id, int rank, const std::string& how, Deadline deadline) {
  CoordMessage q;
  q.kind = CoordKind::kRankExited;
  q.rank = rank;
  q.text = how;
  return toolRequest(id, q, deadline, fmt::format("telling {} that rank {} exited", coordinatorLabel(id), rank));
}

std::string requestMigration(const UniqueIdData& id, int rank, Deadline deadline) {
  CoordMessage q;
  q.kind = CoordKind::kMigrate;
  q.rank = rank;
  return toolRequest(id, q, deadline, fmt::format("migration of rank {} via {}", rank, coordinatorLabel(id)));
}

}  // namespace eccl::membership
