#include "membership/handshake_gate.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/log.h"

namespace eccl::membership {

struct HandshakeGate::Pending {
  Fd fd;
  std::string from, what;
  size_t listener;
  Deadline deadline;
  ServerHandshake handshake;
  uint8_t in[kHelloBytes];
  size_t got = 0;
  std::vector<uint8_t> out;
  size_t sent = 0;

  Pending(Fd f, std::string fromAddr, std::string label, size_t l, Deadline d, const SecretLookup& lookup)
      : fd(std::move(f)), from(std::move(fromAddr)), what(label), listener(l), deadline(d),
        handshake(lookup, std::move(label)) {}
};

HandshakeGate::HandshakeGate(const Secret& secret, uint64_t jobId, GateOptions options, std::string owner)
    : HandshakeGate(singleJob(secret, jobId), options, std::move(owner)) {}

HandshakeGate::HandshakeGate(SecretLookup lookup, GateOptions options, std::string owner)
    : lookup_(std::move(lookup)), opt_(options), owner_(std::move(owner)) {}

HandshakeGate::~HandshakeGate() = default;

size_t HandshakeGate::addListener(int listenFd, AcceptFn accept) {
  setNonBlocking(listenFd, true);
  listeners_.push_back({listenFd, std::move(accept)});
  return listeners_.size() - 1;
}

void HandshakeGate::pollSet(std::vector<pollfd>* fds) const {
  for (const Listener& l : listeners_) fds->push_back({l.fd, POLLIN, 0});
  for (const auto& p : pending_)
    fds->push_back({p->fd.get(), static_cast<short>(p->sent < p->out.size() ? POLLOUT : POLLIN), 0});
}

int HandshakeGate::msUntilNextDeadline(int cap) const {
  int64_t wait = cap;
  for (const auto& p : pending_) wait = std::min(wait, msUntil(p->deadline));
  return static_cast<int>(wait);
}

std::vector<Admitted> HandshakeGate::runOnce(int timeoutMs) {
  std::vector<pollfd> fds;
  pollSet(&fds);
  int n = ::poll(fds.data(), fds.size(), msUntilNextDeadline(timeoutMs));
  if (n < 0 && errno != EINTR) fail(ecclSystemError, "{}: poll(): {}", owner_, strerror(errno));
  if (n <= 0)
    for (auto& f : fds) f.revents = 0;
  std::vector<Admitted> admitted;
  service(fds.data(), fds.size(), &admitted);
  return admitted;
}

void HandshakeGate::service(const pollfd* fds, size_t count, std::vector<Admitted>* admitted) {
  // The entries follow pollSet()'s order; connections accepted below are
  // appended after the ones polled, so indices stay valid.
  size_t polled = std::min(pending_.size(), count - std::min(count, listeners_.size()));
  std::deque<std::unique_ptr<Pending>> before;
  before.swap(pending_);
  for (size_t i = 0; i < before.size(); ++i) {
    Pending& p = *before[i];
    short ev = i < polled ? fds[listeners_.size() + i].revents : 0;
    bool keep = advance(p, ev, admitted);
    if (keep && Clock::now() >= p.deadline) {
      drop(p, fmt::format("no proof of the job secret within {} ms", opt_.handshakeTimeoutMs), timedOut_);
      keep = false;
    }
    if (keep) pending_.push_back(std::move(before[i]));
  }
  for (size_t l = 0; l < listeners_.size() && l < count; ++l)
    if (fds[l].revents & POLLIN) acceptAll(l, admitted);
}

void HandshakeGate::acceptAll(size_t listener, std::vector<Admitted>* admitted) {
  for (;;) {
    std::string from;
    Fd fd = listeners_[listener].accept(&from);
    if (!fd) return;
    accepted_++;
    if (pending_.size() >= opt_.maxPending) {
      // The oldest that has not sent a whole hello goes first: a member's
      // hello comes with its connect, and a flood opening connections
      // faster than a member finishes its handshake must not push the
      // member out. Only when every one is past its hello is the oldest
      // dropped.
      auto victim = std::find_if(pending_.begin(), pending_.end(), [](const auto& p) { return p->out.empty(); });
      const bool silent = victim != pending_.end();
      if (!silent) victim = pending_.begin();
      drop(**victim,
           fmt::format("{} unauthenticated connections were waiting (the cap), and it was the oldest{}",
                       pending_.size(), silent ? " without a whole hello" : ""),
           evicted_);
      pending_.erase(victim);
    }
    std::string what = fmt::format("{}: connection from {}", owner_, from);
    pending_.push_back(std::make_unique<Pending>(std::move(fd), from, std::move(what), listener,
                                                 deadlineAfterMs(opt_.handshakeTimeoutMs), lookup_));
    // A prompt peer's hello is often already here: no need to wait a poll.
    if (!advance(*pending_.back(), POLLIN, admitted)) pending_.pop_back();
  }
}

bool HandshakeGate::advance(Pending& p, short revents, std::vector<Admitted>* admitted) {
  if (!revents) return true;
  try {
    for (;;) {
      if (p.sent < p.out.size()) {
        ssize_t rc = ::send(p.fd.get(), p.out.data() + p.sent, p.out.size() - p.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (rc < 0 && (errno == EAGAIN || errno == EINTR)) return true;
        if (rc < 0) fail(ecclRemoteError, "{}: send failed: {}", p.what, strerror(errno));
        p.sent += static_cast<size_t>(rc);
        if (p.sent < p.out.size()) return true;
        if (!p.handshake.failed().empty()) fail(ecclAuthError, "{}", p.handshake.failed());
        if (p.handshake.done()) {
          admitted_++;
          admitted->push_back({std::move(p.fd), p.handshake.hello(), p.handshake.sessionKey(), p.from, p.listener});
          return false;
        }
      }
      size_t need = p.handshake.needs();
      ssize_t rc = ::recv(p.fd.get(), p.in + p.got, need - p.got, MSG_DONTWAIT);
      if (rc < 0 && (errno == EAGAIN || errno == EINTR)) return true;
      if (rc < 0) fail(ecclRemoteError, "{}: receive failed: {}", p.what, strerror(errno));
      if (rc == 0) fail(ecclRemoteError, "{}: closed during the handshake", p.what);
      p.got += static_cast<size_t>(rc);
      if (p.got < need) return true;
      p.out = p.handshake.take(p.in);
      p.sent = 0;
      p.got = 0;
    }
  } catch (const Error& e) {
    drop(p, e.what(), refused_);
    return false;
  }
}

void HandshakeGate::drop(Pending& p, const std::string& why, std::atomic<uint64_t>& counter) {
  counter++;
  p.fd.reset();
  auto now = Clock::now();
  if (now - logWindow_ >= std::chrono::seconds(10)) {
    if (unlogged_)
      log::warn("{}: {} more unauthenticated connections were refused or dropped (not shown)", owner_, unlogged_);
    logWindow_ = now;
    loggedInWindow_ = 0;
    unlogged_ = 0;
  }
  if (loggedInWindow_++ < 8) {
    bool named = why.find(p.what) != std::string::npos;
    log::warn("rejected {}{}{}", named ? "" : p.what, named ? "" : ": ", why);
  } else {
    unlogged_++;
  }
}

GateStats HandshakeGate::stats() const {
  return {accepted_.load(), admitted_.load(), refused_.load(), timedOut_.load(), evicted_.load()};
}

}  // namespace eccl::membership
