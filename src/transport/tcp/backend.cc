#include "transport/tcp/backend.h"

#include <sys/socket.h>

#include <cerrno>

namespace eccl::transport {
namespace {

class TcpConduit final : public Conduit {
 public:
  explicit TcpConduit(Fd fd) : fd_(std::move(fd)) { setNonBlocking(fd_.get(), true); }
  const char* kind() const override { return "tcp"; }
  int pollFd() const override { return fd_.get(); }
  bool writableByPoll() const override { return true; }

  ssize_t write(const iovec* iov, int count) override {
    msghdr msg{};
    msg.msg_iov = const_cast<iovec*>(iov);
    msg.msg_iovlen = static_cast<size_t>(count);
    ssize_t rc = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (rc < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
    return rc;
  }

  ssize_t read(void* into, size_t n) override {
    ssize_t rc = ::recv(fd_.get(), into, n, MSG_DONTWAIT);
    if (rc < 0 && errno == EINTR) errno = EAGAIN;
    return rc;
  }

 private:
  Fd fd_;
};

}  // namespace

TcpBackend::TcpBackend(const std::string& ifnameSpec) {
  nic_ = pickInterface(ifnameSpec);
  auto [fd, bound] = listenOn(nic_.addr);
  listenFd_ = std::move(fd);
  address_ = bound;
  setNonBlocking(listenFd_.get(), true);
}

Fd TcpBackend::dial(MemberId, const SockAddr& address, Deadline deadline, const std::string& what,
                    const std::function<bool()>& giveUp) {
  return connectTo(address, deadline, what, giveUp);
}

Fd TcpBackend::accept(std::string* from) {
  SockAddr peer;
  peer.len = sizeof(peer.storage);
  int fd = ::accept4(listenFd_.get(), reinterpret_cast<sockaddr*>(&peer.storage), &peer.len, SOCK_CLOEXEC);
  if (fd < 0) return Fd();
  setNoDelay(fd);
  if (from) *from = peer.str();
  return Fd(fd);
}

std::unique_ptr<Conduit> TcpBackend::openDialed(Fd stream, Deadline, const std::string&) {
  return std::make_unique<TcpConduit>(std::move(stream));
}

std::unique_ptr<Conduit> TcpBackend::openAccepted(Fd stream, Deadline, const std::string&) {
  return std::make_unique<TcpConduit>(std::move(stream));
}

}  // namespace eccl::transport
