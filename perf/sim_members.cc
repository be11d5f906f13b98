#include "sim_members.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>
#include <deque>

#include "common/crypto.h"
#include "common/error.h"
#include "membership/coord_channel.h"
#include "membership/handshake.h"

namespace eccl::perf {

using membership::CoordKind;
using membership::CoordMessage;
using membership::Role;
using membership::SealedChannel;

struct SimulatedMembers::Member {
  std::unique_ptr<SealedChannel> channel;  // touched by its loop only, once adopted
  membership::HeldView held;
  std::unique_ptr<Seen> seen = std::make_unique<Seen>();
  Deadline nextBeat;
  bool open = true;
};

// One event loop and the members it serves. Requests from other threads
// (adopt, kill, ask, leave) are queued under `mu` and the loop woken.
struct SimulatedMembers::Loop {
  Fd epoll, wake;
  std::thread thread;
  std::mutex mu;
  std::vector<Member*> adopted, killed;
  uint32_t askEpoch = 0, askPolicy = 0;
  uint64_t askGeneration = 0, leaveGeneration = 0;
  std::vector<Member*> members;   // loop-only
  std::deque<Member*> beats;      // loop-only, by nextBeat (every interval is the same)
  uint64_t askedGeneration = 0, leftGeneration = 0;

  void poke() {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake.get(), &one, sizeof(one));
  }
};

namespace {
int64_t nowNs() { return Clock::now().time_since_epoch().count(); }
}  // namespace

SimulatedMembers::SimulatedMembers(const membership::UniqueIdData& job, Options options)
    : job_(job), opt_(options) {
  for (int i = 0; i < opt_.loops; ++i) {
    auto loop = std::make_unique<Loop>();
    loop->epoll = Fd(epoll_create1(EPOLL_CLOEXEC));
    loop->wake = Fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!loop->epoll || !loop->wake) fail(ecclSystemError, "sim members: epoll/eventfd: {}", strerror(errno));
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.ptr = nullptr;  // the wake-up
    epoll_ctl(loop->epoll.get(), EPOLL_CTL_ADD, loop->wake.get(), &e);
    Loop* raw = loop.get();
    loop->thread = std::thread([this, raw] {
      serve(*raw);
      releaseThreadCryptoState();
    });
    loops_.push_back(std::move(loop));
  }
}

SimulatedMembers::~SimulatedMembers() {
  stopping_ = true;
  for (auto& l : loops_) l->poke();
  for (auto& l : loops_) l->thread.join();
}

SimulatedMembers::Seen& SimulatedMembers::seen(size_t member) {
  std::lock_guard<std::mutex> lock(membersMu_);
  return *members_.at(member)->seen;
}

size_t SimulatedMembers::join(Role role, int rank, int nranks, uint64_t memberId, Deadline deadline) {
  auto m = std::make_unique<Member>();
  m->seen->id = memberId;
  const std::string what = fmt::format("simulated member {:016x}", memberId);
  Fd fd = membership::connectToCoordinator(job_, deadline, what);
  membership::Hello hello{membership::Purpose::kBootstrap, job_.jobId, memberId, 0, 0};
  Secret key;
  membership::authenticateAsClient(fd.get(), job_.secret, hello, deadline, what, &key);
  m->channel = std::make_unique<SealedChannel>(std::move(fd), key, false, "the coordinator");
  CoordMessage j;
  j.kind = CoordKind::kJoin;
  j.role = role;
  j.rank = rank;
  j.nranks = static_cast<uint32_t>(nranks);
  j.member = memberId;
  j.pid = static_cast<uint64_t>(getpid());
  j.address = "127.0.0.1:" + std::to_string(20000 + (rank < 0 ? 0 : rank % 40000));
  m->channel->send(j, deadline);
  m->nextBeat = deadlineAfterMs(opt_.heartbeatMs);
  Member* raw = m.get();
  size_t index;
  {
    std::lock_guard<std::mutex> lock(membersMu_);
    index = members_.size();
    members_.push_back(std::move(m));
  }
  Loop& loop = *loops_[nextLoop_++ % loops_.size()];
  {
    std::lock_guard<std::mutex> lock(loop.mu);
    loop.adopted.push_back(raw);
  }
  loop.poke();
  return index;
}

void SimulatedMembers::kill(size_t member) {
  Member* m;
  {
    std::lock_guard<std::mutex> lock(membersMu_);
    m = members_.at(member).get();
  }
  for (auto& l : loops_) {
    std::lock_guard<std::mutex> lock(l->mu);
    l->killed.push_back(m);  // the loop that serves it closes it; the others find it not theirs
    l->poke();
  }
}

void SimulatedMembers::askRecover(uint32_t epoch, uint32_t policy) {
  for (auto& l : loops_) {
    std::lock_guard<std::mutex> lock(l->mu);
    l->askEpoch = epoch;
    l->askPolicy = policy;
    ++l->askGeneration;
    l->poke();
  }
}

void SimulatedMembers::leaveAll(Deadline deadline) {
  for (auto& l : loops_) {
    std::lock_guard<std::mutex> lock(l->mu);
    ++l->leaveGeneration;
    l->poke();
  }
  // The goodbyes are sent on the loops; give them until the deadline to go.
  for (auto& l : loops_)
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(l->mu);
        if (l->leftGeneration == l->leaveGeneration) break;
      }
      if (Clock::now() >= deadline) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
}

void SimulatedMembers::note(const std::string& error) {
  std::lock_guard<std::mutex> lock(countMu_);
  if (error_.empty()) error_ = error;
  countCv_.notify_all();
}

std::string SimulatedMembers::firstError() const {
  std::lock_guard<std::mutex> lock(countMu_);
  return error_;
}

void SimulatedMembers::countView(uint32_t epoch) {
  std::lock_guard<std::mutex> lock(countMu_);
  if (viewsAtEpoch_.size() <= epoch) viewsAtEpoch_.resize(epoch + 1);
  ++viewsAtEpoch_[epoch];
  countCv_.notify_all();
}

void SimulatedMembers::countTold() {
  std::lock_guard<std::mutex> lock(countMu_);
  ++told_;
  countCv_.notify_all();
}

bool SimulatedMembers::awaitViews(size_t count, uint32_t epoch, Deadline deadline) {
  std::unique_lock<std::mutex> lock(countMu_);
  return countCv_.wait_until(lock, deadline, [&] {
    size_t reached = 0;
    for (size_t e = epoch; e < viewsAtEpoch_.size(); ++e) reached += viewsAtEpoch_[e];
    return reached >= count || !error_.empty();
  }) && error_.empty();
}

bool SimulatedMembers::awaitTold(size_t count, Deadline deadline) {
  std::unique_lock<std::mutex> lock(countMu_);
  return countCv_.wait_until(lock, deadline, [&] { return told_ >= count || !error_.empty(); }) && error_.empty();
}

// A member's messages: views are rebuilt (whole or from a delta) exactly as
// the member client does, and a view that does not apply is an error.
void SimulatedMembers::handle(Member& m) {
  std::vector<CoordMessage> got;
  bool open = true;
  std::string failure;
  try {
    open = m.channel->drain(&got);
  } catch (const Error& e) {
    failure = e.what();
  }
  for (CoordMessage& msg : got) {
    if (msg.kind == CoordKind::kView) {
      std::string why;
      if (!membership::takeView(&m.held, &msg, &why)) {
        failure = why;
        break;
      }
      if (msg.rank < 0) continue;  // a standby's view of the job: it holds no rank yet
      const int watched = watchedRank_;
      if (watched >= 0 && static_cast<size_t>(watched) < m.held.entries.size())
        m.seen->memberAtWatched = m.held.entries[watched].member;
      m.seen->viewAtNs = nowNs();
      m.seen->epoch = msg.epoch;
      countView(msg.epoch);
    } else if (msg.kind == CoordKind::kFailed) {
      int64_t zero = 0;
      if (m.seen->toldAtNs.compare_exchange_strong(zero, nowNs())) countTold();
    } else if (msg.kind == CoordKind::kError || msg.kind == CoordKind::kEvicted) {
      failure = fmt::format("the coordinator said {}: {}", membership::coordKindName(msg.kind), msg.text);
    }
  }
  if (failure.empty() && !open) failure = "the coordinator closed the connection";
  if (!failure.empty()) {
    if (!stopping_) note(fmt::format("member {:016x}: {}", m.seen->id, failure));
    m.open = false;
    m.channel.reset();
  }
}

void SimulatedMembers::serve(Loop& loop) {
  auto sendOrNote = [&](Member& m, const CoordMessage& msg) {
    try {
      m.channel->send(msg, deadlineAfterMs(opt_.heartbeatTimeoutMs));
    } catch (const Error& e) {
      if (!stopping_) note(fmt::format("member {:016x}: {}", m.seen->id, e.what()));
      m.open = false;
      m.channel.reset();
    }
  };
  while (!stopping_) {
    epoll_event events[256];
    int wait = loop.beats.empty() ? 100 : static_cast<int>(std::min<int64_t>(msUntil(loop.beats.front()->nextBeat), 100));
    int n = epoll_wait(loop.epoll.get(), events, 256, wait);
    for (int i = 0; i < n; ++i) {
      if (!events[i].data.ptr) {
        uint64_t drained;
        [[maybe_unused]] ssize_t r = ::read(loop.wake.get(), &drained, sizeof(drained));
        continue;
      }
      Member& m = *static_cast<Member*>(events[i].data.ptr);
      if (m.open) handle(m);
    }
    std::vector<Member*> adopted, killed;
    uint64_t askGeneration, leaveGeneration;
    uint32_t askEpoch, askPolicy;
    {
      std::lock_guard<std::mutex> lock(loop.mu);
      adopted.swap(loop.adopted);
      killed.swap(loop.killed);
      askGeneration = loop.askGeneration;
      leaveGeneration = loop.leaveGeneration;
      askEpoch = loop.askEpoch;
      askPolicy = loop.askPolicy;
    }
    for (Member* m : adopted) {
      epoll_event e{};
      e.events = EPOLLIN;
      e.data.ptr = m;
      epoll_ctl(loop.epoll.get(), EPOLL_CTL_ADD, m->channel->fd(), &e);
      loop.members.push_back(m);
      loop.beats.push_back(m);
      handle(*m);  // the view may have come with the join
    }
    for (Member* m : killed)
      if (std::find(loop.members.begin(), loop.members.end(), m) != loop.members.end() && m->open) {
        m->open = false;
        m->channel.reset();  // closes without a goodbye
      }
    if (askGeneration != loop.askedGeneration) {
      loop.askedGeneration = askGeneration;
      CoordMessage ask;
      ask.kind = CoordKind::kRecover;
      ask.epoch = askEpoch;
      ask.policy = askPolicy;
      for (Member* m : loop.members)
        if (m->open && m->seen->toldAtNs.load() != 0) sendOrNote(*m, ask);
    }
    if (leaveGeneration != loop.leftGeneration) {
      CoordMessage bye;
      bye.kind = CoordKind::kLeave;
      for (Member* m : loop.members)
        if (m->open) {
          sendOrNote(*m, bye);
          m->open = false;
          m->channel.reset();
        }
      std::lock_guard<std::mutex> lock(loop.mu);
      loop.leftGeneration = leaveGeneration;
    }
    const auto now = Clock::now();
    CoordMessage beat;
    beat.kind = CoordKind::kHeartbeat;
    while (!loop.beats.empty() && loop.beats.front()->nextBeat <= now) {
      Member* m = loop.beats.front();
      loop.beats.pop_front();
      if (!m->open) continue;
      sendOrNote(*m, beat);
      m->nextBeat = now + std::chrono::milliseconds(opt_.heartbeatMs);
      loop.beats.push_back(m);
    }
  }
}

}  // namespace eccl::perf
