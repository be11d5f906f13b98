// Shared memory for the rings of one pair of members: an anonymous memory
// file (memfd), so no name exists in /dev/shm that a crash could leave
// behind; the file lives while either side maps it. The creator hands its
// descriptor to the peer over a Unix socket (SCM_RIGHTS). Neither side maps
// it populated: allocating a lane's 2.6 MiB took 1.9-2.4 ms here, paid
// inside every connection a reconfiguration opens, and most lanes that
// collectives reading in place open carry little through their rings.
// A ring's pages come on first touch (two page faults per 4 KiB on its
// first lap, once per lane); the back end prefaults the small parts every
// message touches (the fast-path slots).
#pragma once

#include <cstddef>
#include <string>

#include "common/clock.h"
#include "common/socket.h"

namespace eccl::transport::shm {

class Segment {
 public:
  // A new zeroed segment of `bytes`; `name` shows in /proc/<pid>/maps.
  static Segment create(const std::string& name, size_t bytes);
  // Maps a segment another process created, after checking its size.
  static Segment map(Fd fd, size_t expectedBytes);
  Segment() = default;
  Segment(Segment&& o) noexcept;
  Segment& operator=(Segment&& o) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment();

  // Allocates and maps `bytes` from `offset` (clipped to the segment)
  // without touching their contents; false where the kernel cannot
  // (before Linux 5.14): the pages then fault on first touch.
  bool prefault(size_t offset, size_t bytes) const;

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  int fd() const { return fd_.get(); }

 private:
  Fd fd_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Passes a descriptor, with a few bytes of payload, over a connected Unix
// stream socket; both throw eccl::Error naming `what` at the deadline or on
// a closed socket.
void sendFd(int socket, int fd, const void* payload, size_t bytes, Deadline deadline, const std::string& what);
Fd recvFd(int socket, void* payload, size_t bytes, Deadline deadline, const std::string& what);

}  // namespace eccl::transport::shm
