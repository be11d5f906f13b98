// The shared-memory back end, for members in the same network namespace on
// one host. Each lane is a memfd segment holding two rings (one per
// direction) and a connected Unix socket beside it, which the device polls:
// a byte on it is a doorbell (data or room in a ring the sleeper armed), and
// its end of file is the peer's death, exactly as a TCP lane's.
//
// Every member listens on an abstract Unix socket with a fresh random name,
// which is its address. Abstract names live in a network namespace, so a
// dial reaches only a member on this host and in this namespace; anything
// else is refused and the device goes on to its next back end. The stream is
// authenticated (HMAC over the job secret) before the dialer creates the
// segment and passes its descriptor over (SCM_RIGHTS): no file exists in
// /dev/shm, and the memory goes when both ends unmap it, after a crash too.
// Chunks of at least ECCL_SHM_ZERO_COPY_BYTES are copied once, by the
// sender, straight into the receiver's buffer (process_vm_writev), where
// the kernel allows it; through the rings otherwise.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "transport/backend.h"

namespace eccl::transport::shm {

// Counted by the lanes, read by the device's stats() from any thread.
struct ShmCounters {
  std::atomic<uint64_t> singleCopyLanes{0}, singleCopyRefused{0}, singleCopyBytes{0};
  std::atomic<uint64_t> peerReadLanes{0};  // lanes whose peer's memory this process may read
};

class ShmBackend final : public Backend {
 public:
  explicit ShmBackend(const BackendOptions& options);
  const char* name() const override { return "shm"; }
  std::string address() const override { return socketName_; }
  std::string describe() const override { return "shared memory (@" + socketName_ + ")"; }
  int listenFd() const override { return listenFd_.get(); }
  BackendCounters counters() const override;
  bool listensHere(const std::string& part) const override;
  Fd dial(MemberId member, const std::string& address, Deadline deadline, const std::string& what,
          const std::function<bool()>& giveUp) override;
  Fd accept(std::string* from) override;
  std::unique_ptr<Conduit> openDialed(Fd stream, Deadline deadline, const std::string& what) override;
  std::unique_ptr<Conduit> openAccepted(Fd stream, Deadline deadline, const std::string& what) override;

  // Ring sizes a dialer may announce: powers of two in [4 KiB, 1 GiB].
  static bool validRingBytes(uint64_t bytes);

 private:
  BackendOptions opt_;
  std::string socketName_;  // abstract, without its leading NUL
  Fd listenFd_;
  std::shared_ptr<ShmCounters> counters_ = std::make_shared<ShmCounters>();
};

BackendSpec backendSpec();

}  // namespace eccl::transport::shm
