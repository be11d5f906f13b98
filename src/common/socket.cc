#include "common/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"

namespace eccl {

std::string SockAddr::str() const {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (storage.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&storage);
    inet_ntop(AF_INET, &a->sin_addr, ip, sizeof(ip));
    return fmt::format("{}:{}", ip, ntohs(a->sin_port));
  }
  if (storage.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&storage);
    inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof(ip));
    return fmt::format("[{}]:{}", ip, ntohs(a->sin6_port));
  }
  return "<no address>";
}

int SockAddr::port() const {
  if (storage.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (storage.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return -1;
}

void SockAddr::setPort(int port) {
  if (storage.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(port);
  if (storage.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(port);
}

SockAddr SockAddr::parse(const std::string& text) {
  SockAddr out;
  auto colon = text.rfind(':');
  if (colon == std::string::npos) fail(ecclInvalidArgument, "address '{}' has no port", text);
  std::string host = text.substr(0, colon);
  int port = std::atoi(text.c_str() + colon + 1);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    auto* a = reinterpret_cast<sockaddr_in6*>(&out.storage);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(port);
    if (inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &a->sin6_addr) != 1)
      fail(ecclInvalidArgument, "'{}' is not an IPv6 address", host);
    out.len = sizeof(sockaddr_in6);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&out.storage);
    a->sin_family = AF_INET;
    a->sin_port = htons(port);
    if (inet_pton(AF_INET, host.c_str(), &a->sin_addr) != 1)
      fail(ecclInvalidArgument, "'{}' is not an IPv4 address", host);
    out.len = sizeof(sockaddr_in);
  }
  return out;
}

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

void setNonBlocking(int fd, bool on) {
  int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

void setNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::pair<Fd, SockAddr> listenOn(const SockAddr& addr, int backlog) {
  Fd fd(::socket(addr.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) fail(ecclSystemError, "socket(): {}", strerror(errno));
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.len) != 0)
    fail(ecclSystemError, "bind({}): {}", addr.str(), strerror(errno));
  if (::listen(fd.get(), backlog) != 0) fail(ecclSystemError, "listen({}): {}", addr.str(), strerror(errno));
  SockAddr bound;
  bound.len = sizeof(bound.storage);
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound.storage), &bound.len);
  return {std::move(fd), bound};
}

namespace {

// Waits for `events` on fd until the deadline; false on timeout.
bool waitFd(int fd, short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(msUntil(deadline), 1 << 30)));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) fail(ecclSystemError, "poll(): {}", strerror(errno));
  }
}

}  // namespace

Fd connectTo(const SockAddr& addr, Deadline deadline, const std::string& what, const std::function<bool()>& giveUp) {
  int lastErr = 0;
  do {
    Fd fd(::socket(addr.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd) fail(ecclSystemError, "socket(): {}", strerror(errno));
    setNonBlocking(fd.get(), true);
    int rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.len);
    if (rc != 0 && errno == EINPROGRESS) {
      if (!waitFd(fd.get(), POLLOUT, deadline)) break;
      socklen_t len = sizeof(lastErr);
      getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &lastErr, &len);
      rc = lastErr == 0 ? 0 : -1;
    } else if (rc != 0) {
      lastErr = errno;
    }
    if (rc == 0) {
      setNonBlocking(fd.get(), false);
      setNoDelay(fd.get());
      return fd;
    }
    if (lastErr != ECONNREFUSED && lastErr != EAGAIN && lastErr != ETIMEDOUT)
      fail(ecclSystemError, "{}: connect to {} failed: {}", what, addr.str(), strerror(lastErr));
    if (giveUp && giveUp())
      fail(ecclRemoteError, "{}: connect to {} abandoned ({}): the peer is gone", what, addr.str(), strerror(lastErr));
    ::usleep(20 * 1000);
  } while (Clock::now() < deadline);
  fail(ecclTimeout, "{}: could not connect to {} before the deadline ({})", what, addr.str(),
       lastErr ? strerror(lastErr) : "no answer");
}

Fd acceptUntil(int listenFd, Deadline deadline, SockAddr* peer) {
  if (!waitFd(listenFd, POLLIN, deadline)) return Fd();
  return acceptPending(listenFd, peer);
}

Fd acceptPending(int listenFd, SockAddr* peer) {
  SockAddr from;
  from.len = sizeof(from.storage);
  int fd = ::accept4(listenFd, reinterpret_cast<sockaddr*>(&from.storage), &from.len, SOCK_CLOEXEC);
  if (fd < 0) return Fd();
  setNoDelay(fd);
  if (peer) *peer = from;
  return Fd(fd);
}

void sendAll(int fd, const void* buf, size_t n, Deadline deadline, const std::string& what) {
  auto* p = static_cast<const uint8_t*>(buf);
  while (n > 0) {
    ssize_t rc = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (rc > 0) {
      p += rc;
      n -= static_cast<size_t>(rc);
    } else if (rc < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!waitFd(fd, POLLOUT, deadline)) fail(ecclTimeout, "{}: send timed out", what);
    } else {
      fail(ecclRemoteError, "{}: send failed: {}", what, strerror(errno));
    }
  }
}

void recvAll(int fd, void* buf, size_t n, Deadline deadline, const std::string& what) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    ssize_t rc = ::recv(fd, p, n, MSG_DONTWAIT);
    if (rc > 0) {
      p += rc;
      n -= static_cast<size_t>(rc);
    } else if (rc == 0) {
      fail(ecclRemoteError, "{}: connection closed by the peer", what);
    } else if (errno == EAGAIN || errno == EINTR) {
      if (!waitFd(fd, POLLIN, deadline)) fail(ecclTimeout, "{}: receive timed out", what);
    } else {
      fail(ecclRemoteError, "{}: receive failed: {}", what, strerror(errno));
    }
  }
}

}  // namespace eccl
