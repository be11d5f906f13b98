// Thin, deadline-aware helpers over POSIX sockets (IPv4 and IPv6).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <functional>
#include <string>
#include <utility>

#include "common/clock.h"

namespace eccl {

struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;

  std::string str() const;  // "1.2.3.4:5" or "[::1]:5"
  int port() const;
  void setPort(int port);
  static SockAddr parse(const std::string& text);  // inverse of str(); throws
};

// Owns one file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Listens on addr (port 0 picks one); returns the socket and the bound address.
std::pair<Fd, SockAddr> listenOn(const SockAddr& addr, int backlog = 512);
// Connects, retrying refused connections until the deadline (the listener
// may not be up yet) or until `giveUp` says the peer is known to be gone.
// The socket is returned blocking with TCP_NODELAY.
Fd connectTo(const SockAddr& addr, Deadline deadline, const std::string& what,
             const std::function<bool()>& giveUp = {});
// Accepts one connection, waiting at most until the deadline; empty Fd on timeout.
Fd acceptUntil(int listenFd, Deadline deadline, SockAddr* peer);
// One connection already pending on a listener (empty Fd if none), no delay set.
Fd acceptPending(int listenFd, SockAddr* peer);

void setNonBlocking(int fd, bool on);
void setNoDelay(int fd);

// Blocking full transfers with a deadline; throw eccl::Error naming `what`.
void sendAll(int fd, const void* buf, size_t n, Deadline deadline, const std::string& what);
void recvAll(int fd, void* buf, size_t n, Deadline deadline, const std::string& what);

}  // namespace eccl
