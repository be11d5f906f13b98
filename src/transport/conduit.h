// One lane's byte stream, what a back end (backend.h) hands the device once
// a connection is authenticated. The device above owns all policy (frames,
// epochs, revocation, roles, notices, liveness, authentication); a conduit
// only moves bytes.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "transport/fast_channel.h"
#include "transport/transport.h"

namespace eccl::transport {

// One lane's byte stream to one peer. Used under the device lock, except
// read() of a conduit whose readsBesideCalls() holds: the device then
// copies a large payload without its lock, so that read may run beside
// any other call on the same conduit (never beside another read, and the
// conduit is not destroyed before it returns).
class Conduit {
 public:
  virtual ~Conduit() = default;
  virtual const char* kind() const = 0;  // "tcp", "shm": names the lane in logs and stats
  // The device says whose lane this is once it installs it (a back end
  // that keys behaviour or statistics by peer and lane listens).
  virtual void attachedTo(MemberId peer, uint32_t lane) { (void)peer, (void)lane; }
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
  // Whether read() may run beside the other calls (see above): the read
  // side's state shares nothing unsynchronised with the write side's.
  virtual bool readsBesideCalls() const { return false; }

  // Called before the device sleeps in poll(): lets the peer's next write
  // (or, with wantSpace, the peer's next read) wake pollFd(). Returns false
  // if there is already something to do, so the device must not sleep.
  virtual bool armWakeup(bool wantSpace) {
    (void)wantSpace;
    return true;
  }

  // Low-priority frames (Device::isendBulk) join the stream only while it
  // holds little the peer has not read yet, so a foreground frame posted
  // next waits behind a frame or two, not behind a stream full of bulk.
  // A back end that sees its peer's reads (a ring in shared or registered
  // memory) says so here; for one that does not (a socket: the kernel
  // buffers on both ends hide it) roomForBulk says yes and the device
  // counts instead, from the peer's reports (FrameType::kBulkRead).
  virtual bool seesPeerReads() const { return false; }
  // What the peer wrote may still be on its way after its write returned
  // (kernel buffers, the network): an empty read is no proof that nothing
  // more of it comes. Not so for a ring in shared memory.
  virtual bool bytesTrailWrites() const { return false; }
  virtual bool roomForBulk() const { return true; }
  // Like armWakeup, for a device that holds bulk frames back: lets the
  // peer's next read wake pollFd(); false when roomForBulk() already holds.
  virtual bool armBulkWakeup() { return !roomForBulk(); }

  // Zero-copy (RDMA): a back end that can write straight into the peer's
  // memory moves chunks of at least zeroCopyMinBytes() that way (0: never).
  // The device does the rendezvous (docs/transport.md): the sender pins its
  // chunk, the receiver exposes where the chunk goes and says so in a
  // clear-to-send, the sender writes it there and then says it landed, on
  // this same lane, whose order puts that word behind the data. Handles
  // are released with release(); a closed lane releases what is left.
  virtual size_t zeroCopyMinBytes() const { return 0; }
  struct Window {
    uint64_t address = 0;
    uint32_t key = 0;
    uint64_t handle = 0;
  };
  // Lets the peer write [buffer, +bytes); nullopt when the memory cannot
  // be exposed now (the chunk then comes on the lane).
  virtual std::optional<Window> expose(void* buffer, size_t bytes) {
    (void)buffer, (void)bytes;
    return std::nullopt;
  }
  // Readies [buffer, +bytes) to be written from; 0 when it cannot be (the
  // chunk then goes on the lane).
  virtual uint64_t pin(const void* buffer, size_t bytes) {
    (void)buffer, (void)bytes;
    return 0;
  }
  virtual void release(uint64_t handle) { (void)handle; }
  // Starts writing a pinned chunk to the peer's window at (address, key);
  // the buffer must stay untouched until zeroCopyWritesDone() counts the
  // write (writes finish in the order they were started). False: no room
  // to start one now (try again later). A failed write breaks the lane
  // (the next write() or read() says so).
  virtual bool writeZeroCopy(uint64_t pinned, const void* buffer, size_t bytes, uint64_t address, uint32_t key) {
    (void)pinned, (void)buffer, (void)bytes, (void)address, (void)key;
    return false;
  }
  virtual uint64_t zeroCopyWritesDone() const { return 0; }
  // Whether writeZeroCopy may run without the device lock, beside the
  // other calls (never beside another writeZeroCopy): a back end that
  // copies in the call itself (shared memory's process_vm_writev), where
  // the copy, not a post, is the time it takes.
  virtual bool writesZeroCopyBesideCalls() const { return false; }

  // Slots for small collective messages beside the lane (fast_channel.h),
  // where the back end has memory both ends map; null otherwise. The same
  // channel every call; it outlives the lane's close (it holds the mapping).
  virtual std::shared_ptr<FastChannel> fastChannel() { return nullptr; }
};

}  // namespace eccl::transport
