// One lane's byte stream, what a back end (backend.h) hands the device once
// a connection is authenticated. The device above owns all policy (frames,
// epochs, revocation, roles, notices, liveness, authentication); a conduit
// only moves bytes.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string>

#include "transport/transport.h"

namespace eccl::transport {

// One lane's byte stream to one peer. Used only under the device lock.
class Conduit {
 public:
  virtual ~Conduit() = default;
  virtual const char* kind() const = 0;  // "tcp", "shm": names the lane in logs and stats
  // Why the lane broke, when write() or read() said so and the back end
  // knows more than errno does (a failed completion, a port that went
  // down); empty otherwise.
  virtual std::string failure() const { return {}; }
  // RDMA queue pairs this lane owns (the statistics count them).
  virtual uint32_t queuePairs() const { return 0; }

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

}  // namespace eccl::transport
