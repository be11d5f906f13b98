// Reads another process's memory on this host (process_vm_readv), for
// same-host collectives that take a peer's data where it lies instead of
// having it copied into a ring or into their own scratch first. The shared
// memory back end makes one per lane where a probe read as the lane opens
// succeeded (same user, no seccomp or Yama rule against it).
//
// The peer's buffer is only valid while the peer is inside the same op, so
// an algorithm must hold the peer there with messages (the peer waits for
// this side's "done" before it returns). Reading never writes the peer's
// memory: a peer that died or left the op costs this side a failed op,
// never the peer its data.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace eccl::transport {

class PeerMemory {
 public:
  explicit PeerMemory(pid_t pid) : pid_(pid) {}
  pid_t pid() const { return pid_; }
  // Copies `bytes` at `address` in the peer into `into`; on failure returns
  // false with the system's reason in `why`.
  bool read(uint64_t address, void* into, size_t bytes, std::string* why) const;
  // Copies `bytes` from `from` to `address` in the peer (process_vm_writev).
  bool write(uint64_t address, const void* from, size_t bytes, std::string* why) const;

 private:
  pid_t pid_;
};

}  // namespace eccl::transport
