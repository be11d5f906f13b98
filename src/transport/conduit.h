// What a back end provides to the device: a way to reach a member (Backend)
// and, per lane, a byte stream (Conduit). The device above owns all policy
// (frames, epochs, revocation, roles, notices, liveness, authentication); a
// back end only moves bytes, so every back end is this same small set:
// tcp/backend.{h,cc}, shm/backend.{h,cc}.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/clock.h"
#include "common/socket.h"
#include "transport/transport.h"

namespace eccl::transport {

// One lane's byte stream to one peer. Used only under the device lock.
class Conduit {
 public:
  virtual ~Conduit() = default;
  virtual const char* kind() const = 0;  // "tcp", "shm": names the lane in logs and stats

  // A descriptor the device polls: readable when bytes arrive or the peer
  // goes away (end of file), and, where writableByPoll(), writable when a
  // full stream has room again. Shared memory has no such descriptor for
  // its data; its doorbell socket becomes readable for both instead.
  virtual int pollFd() const = 0;
  virtual bool writableByPoll() const = 0;
  // Whether bytes can be waiting that pollFd() does not announce: the
  // device then tries such lanes on every pass instead of waiting for an
  // event (memory costs no system call to look at).
  virtual bool pollsMemory() const { return false; }
  // pollFd() was reported ready: consume whatever only announced readiness.
  virtual void onPollReady() {}

  // Writes as much of the iovecs as fits now; returns bytes written (0 if
  // none fit), or -1 with errno set on a broken stream. Never blocks.
  virtual ssize_t write(const iovec* iov, int count) = 0;
  // Reads up to n bytes; > 0: bytes read, 0: the peer closed the stream
  // and everything it sent has been read, -1 with errno (EAGAIN: nothing now).
  virtual ssize_t read(void* into, size_t n) = 0;

  // Called before the device sleeps in poll(): lets the peer's next write
  // (or, with wantSpace, the peer's next read) wake pollFd(). Returns false
  // if there is already something to do, so the device must not sleep.
  virtual bool armWakeup(bool wantSpace) {
    (void)wantSpace;
    return true;
  }
};

// How a back end reaches members. The device dials through the first back
// end that can reach a member and authenticates the stream the back end
// returns before it becomes a conduit; the accept side mirrors it.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // The listening descriptor the device's accept thread polls.
  virtual int listenFd() const = 0;
  // A connected, blocking stream to `member` (whose TCP address is
  // `address`), or an empty Fd when this back end cannot reach it (shared
  // memory: another host or network namespace). Throws when it can reach
  // the member but connecting fails.
  virtual Fd dial(MemberId member, const SockAddr& address, Deadline deadline, const std::string& what,
                  const std::function<bool()>& giveUp) = 0;
  // Accepts one pending stream (the listener was readable); empty Fd if none.
  virtual Fd accept(std::string* from) = 0;
  // After authentication, each end turns its stream into the lane's conduit
  // (shared memory: the dialer creates the rings and passes them over).
  virtual std::unique_ptr<Conduit> openDialed(Fd stream, Deadline deadline, const std::string& what) = 0;
  virtual std::unique_ptr<Conduit> openAccepted(Fd stream, Deadline deadline, const std::string& what) = 0;
};

}  // namespace eccl::transport
