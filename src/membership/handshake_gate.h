// Admission to a listener that nothing unauthenticated can hold up. Every
// listener eccl opens (the coordinator's, each member's TCP and local
// sockets) accepts through a gate: it runs the server side of the HMAC
// handshake for many connections at once without blocking on any, so a
// peer that connects and stays silent, trickles bytes, or sends garbage
// costs one slot until its deadline and delays no other connection. The
// number of unauthenticated connections is capped; past the cap the oldest
// is dropped (an honest peer finishes its handshake in a few round trips,
// so the oldest is the likeliest to be a squatter).
//
// Threads: a gate is driven by one thread (its owner's accept or event
// loop) and is not shared; stats() may be read from any thread.
#pragma once

#include <poll.h>

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/crypto.h"
#include "common/socket.h"
#include "membership/handshake.h"

namespace eccl::membership {

struct GateOptions {
  int64_t handshakeTimeoutMs = 5000;  // an unauthenticated connection's whole time to prove the secret
  size_t maxPending = 128;            // unauthenticated connections held at once
};

struct Admitted {
  Fd fd;  // blocking mode as accepted; nothing beyond the handshake has been read from it
  Hello hello;
  Secret sessionKey;
  std::string from;
  size_t listener = 0;  // the index addListener returned
};

struct GateStats {
  uint64_t accepted = 0, admitted = 0, refused = 0, timedOut = 0, evicted = 0;
  uint64_t rejected() const { return refused + timedOut + evicted; }
};

class HandshakeGate {
 public:
  // `owner` names the listener in log lines ("coordinator", "member 3").
  HandshakeGate(const Secret& secret, uint64_t jobId, GateOptions options, std::string owner);
  // Admits a hello for any job id the lookup knows, proving that job's secret.
  HandshakeGate(SecretLookup lookup, GateOptions options, std::string owner);
  ~HandshakeGate();
  HandshakeGate(const HandshakeGate&) = delete;
  HandshakeGate& operator=(const HandshakeGate&) = delete;

  // `accept` takes one pending connection from listenFd (empty Fd: none)
  // and names where it came from. The listener is made non-blocking.
  using AcceptFn = std::function<Fd(std::string* from)>;
  size_t addListener(int listenFd, AcceptFn accept);

  // Descriptors to poll beside the owner's own: the listeners, then every
  // handshake in progress. Pass the polled array back to service().
  void pollSet(std::vector<pollfd>* fds) const;
  // Accepts what is waiting, advances handshakes whose descriptors are
  // ready, drops the expired; appends the connections that proved the
  // secret. `fds` points at the entries pollSet() appended.
  void service(const pollfd* fds, size_t count, std::vector<Admitted>* admitted);
  // Milliseconds until the next handshake deadline (for the poll timeout), or `cap`.
  int msUntilNextDeadline(int cap) const;
  // Polls only the gate's descriptors for up to timeoutMs, then service().
  std::vector<Admitted> runOnce(int timeoutMs);

  GateStats stats() const;

 private:
  struct Listener {
    int fd;
    AcceptFn accept;
  };
  struct Pending;
  void acceptAll(size_t listener, std::vector<Admitted>* admitted);
  // False when the connection is finished with (admitted or dropped).
  bool advance(Pending& p, short revents, std::vector<Admitted>* admitted);
  void drop(Pending& p, const std::string& why, std::atomic<uint64_t>& counter);

  const SecretLookup lookup_;
  const GateOptions opt_;
  const std::string owner_;
  std::vector<Listener> listeners_;
  std::deque<std::unique_ptr<Pending>> pending_;  // oldest first
  std::atomic<uint64_t> accepted_{0}, admitted_{0}, refused_{0}, timedOut_{0}, evicted_{0};
  // Rejections are logged, but a flood must not flood the log.
  Clock::time_point logWindow_{};
  int loggedInWindow_ = 0;
  uint64_t unlogged_ = 0;
};

}  // namespace eccl::membership
