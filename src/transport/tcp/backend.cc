#include "transport/tcp/backend.h"

#include <sys/socket.h>

#include <cerrno>

#include "common/error.h"
#include "transport/tcp/nic_affinity.h"

namespace eccl::transport::tcp {
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

  bool readsBesideCalls() const override { return true; }  // recv beside send on one socket
  bool bytesTrailWrites() const override { return true; }

  ssize_t read(void* into, size_t n) override {
    ssize_t rc = ::recv(fd_.get(), into, n, MSG_DONTWAIT);
    if (rc < 0 && errno == EINTR) errno = EAGAIN;
    return rc;
  }

 private:
  Fd fd_;
};

}  // namespace

TcpBackend::TcpBackend(const BackendOptions& options) {
  nic_ = pickInterface(options.ifname);
  auto [fd, bound] = listenOn(nic_.addr);
  listenFd_ = std::move(fd);
  address_ = bound;
  setNonBlocking(listenFd_.get(), true);
  loadNicTopology(nic_.name);  // here, not on the progress thread that placeThread() binds
}

std::string TcpBackend::describe() const { return fmt::format("{} (interface {})", address_.str(), nic_.name); }

bool TcpBackend::placeThread() {
  bindThreadNearNic(nic_.name);
  return true;
}

Fd TcpBackend::dial(MemberId, const std::string& address, Deadline deadline, const std::string& what,
                    const std::function<bool()>& giveUp) {
  return connectTo(SockAddr::parse(address), deadline, what, giveUp);
}

Fd TcpBackend::accept(std::string* from) {
  SockAddr peer;
  Fd fd = acceptPending(listenFd_.get(), &peer);
  if (fd && from) *from = peer.str();
  return fd;
}

std::unique_ptr<Conduit> TcpBackend::openDialed(Fd stream, Deadline, const std::string&) {
  return std::make_unique<TcpConduit>(std::move(stream));
}

std::unique_ptr<Conduit> TcpBackend::openAccepted(Fd stream, Deadline, const std::string&) {
  return std::make_unique<TcpConduit>(std::move(stream));
}

BackendSpec backendSpec() {
  return {"tcp", /*reachesOtherHosts=*/true,
          [](const BackendOptions& o) -> std::unique_ptr<Backend> { return std::make_unique<TcpBackend>(o); }};
}

}  // namespace eccl::transport::tcp
