// The shared-memory back end, for members in the same network namespace on
// one host. Each lane is a memfd segment holding two rings (one per
// direction) and a connected Unix socket beside it, which the device polls:
// a byte on it is a doorbell (data or room in a ring the sleeper armed), and
// its end of file is the peer's death, exactly as a TCP lane's.
//
// Every member listens on an abstract Unix socket named after the job,
// itself and its TCP address. Abstract names live in a network namespace,
// so a dial reaches only a member on this host and in this namespace;
// anything else is refused and the device falls back to TCP. The TCP
// address makes the name unique among live listeners of the namespace (no
// two hold one port), whatever ids two jobs chose. The stream is
// authenticated (HMAC over the job secret) before the dialer creates the
// segment and passes its descriptor over (SCM_RIGHTS): no file exists in
// /dev/shm, and the memory goes when both ends unmap it, after a crash too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "transport/conduit.h"

namespace eccl::transport::shm {

struct ShmOptions {
  uint64_t jobId = 0;
  MemberId self = 0;
  SockAddr tcpAddress;  // this member's TCP listener
  size_t ringBytes = 1 << 20;  // per direction and lane
};

class ShmBackend final : public Backend {
 public:
  explicit ShmBackend(const ShmOptions& options);
  const char* name() const override { return "shm"; }
  int listenFd() const override { return listenFd_.get(); }
  Fd dial(MemberId member, const SockAddr& address, Deadline deadline, const std::string& what,
          const std::function<bool()>& giveUp) override;
  Fd accept(std::string* from) override;
  std::unique_ptr<Conduit> openDialed(Fd stream, Deadline deadline, const std::string& what) override;
  std::unique_ptr<Conduit> openAccepted(Fd stream, Deadline deadline, const std::string& what) override;

  // The abstract socket name (without its leading NUL) of a member.
  static std::string socketName(uint64_t jobId, MemberId member, const SockAddr& tcpAddress);
  // Ring sizes a dialer may announce: powers of two in [4 KiB, 1 GiB].
  static bool validRingBytes(uint64_t bytes);

 private:
  ShmOptions opt_;
  Fd listenFd_;
};

}  // namespace eccl::transport::shm
