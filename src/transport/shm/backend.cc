#include "transport/shm/backend.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "common/crypto.h"
#include "common/error.h"
#include "common/log.h"
#include "transport/shm/ring.h"
#include "transport/shm/segment.h"

namespace eccl::transport::shm {
namespace {

constexpr uint64_t kSegmentMagic = 0x4d48534c43434345ull;  // "ECCLSHM" + version

struct SegmentAnnouncement {
  uint64_t magic;
  uint64_t ringBytes;
};

sockaddr_un abstractAddress(const std::string& name, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  const size_t n = std::min(name.size(), sizeof(a.sun_path) - 1);
  std::memcpy(a.sun_path + 1, name.data(), n);
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return a;
}

class ShmConduit final : public Conduit {
 public:
  ShmConduit(Fd doorbell, Segment segment, Ring* tx, Ring* rx)
      : doorbell_(std::move(doorbell)), segment_(std::move(segment)), tx_(tx), rx_(rx) {
    setNonBlocking(doorbell_.get(), true);
  }
  ~ShmConduit() override {
    tx_->markClosed();
    rx_->markClosed();
  }
  const char* kind() const override { return "shm"; }
  int pollFd() const override { return doorbell_.get(); }
  bool writableByPoll() const override { return false; }
  bool pollsMemory() const override { return true; }

  void onPollReady() override {
    char sink[256];
    for (;;) {
      ssize_t rc = ::recv(doorbell_.get(), sink, sizeof(sink), MSG_DONTWAIT);
      if (rc > 0 && static_cast<size_t>(rc) == sizeof(sink)) continue;
      if (rc == 0 || (rc < 0 && errno != EAGAIN && errno != EINTR)) peerGone_ = true;
      return;
    }
  }

  ssize_t write(const iovec* iov, int count) override {
    if (peerGone_ || tx_->closed()) {
      errno = EPIPE;
      return -1;
    }
    size_t total = 0;
    for (int i = 0; i < count; ++i) {
      size_t n = tx_->put(iov[i].iov_base, iov[i].iov_len);
      total += n;
      if (n < iov[i].iov_len) break;
    }
    if (total > 0 && tx_->takeReaderArm()) ring();
    return static_cast<ssize_t>(total);
  }

  ssize_t read(void* into, size_t n) override {
    size_t got = rx_->take(into, n);
    if (got > 0) {
      if (rx_->takeWriterArm()) ring();
      return static_cast<ssize_t>(got);
    }
    // Everything the peer wrote before it went is read first, including
    // what it wrote between our look at the ring and its close.
    if (peerGone_ || rx_->closed()) {
      got = rx_->take(into, n);
      return static_cast<ssize_t>(got);
    }
    errno = EAGAIN;
    return -1;
  }

  bool armWakeup(bool wantSpace) override {
    bool sleep = rx_->armReader();
    if (wantSpace) sleep = tx_->armWriter() && sleep;
    return sleep;
  }

  // Bulk waits while 64 KiB (a quarter of a smaller ring) is unread: a
  // foreground frame behind it waits for that much to be copied out; the
  // peer rings the doorbell as it reads (takeWriterArm).
  bool seesPeerReads() const override { return true; }
  bool roomForBulk() const override { return tx_->readable() < bulkFillBytes(); }
  bool armBulkWakeup() override { return tx_->armWriterBelow(bulkFillBytes()); }

 private:
  size_t bulkFillBytes() const { return std::min<size_t>(tx_->capacity(), 256 << 10) / 4; }

  // A full socket buffer already holds a doorbell the peer has not taken.
  void ring() {
    char one = 1;
    [[maybe_unused]] ssize_t rc = ::send(doorbell_.get(), &one, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
  }

  Fd doorbell_;
  Segment segment_;
  Ring* tx_;
  Ring* rx_;
  bool peerGone_ = false;
};

}  // namespace

bool ShmBackend::validRingBytes(uint64_t bytes) {
  return bytes >= 4096 && bytes <= (uint64_t{1} << 30) && (bytes & (bytes - 1)) == 0;
}

ShmBackend::ShmBackend(const BackendOptions& options) : opt_(options) {
  ECCL_CHECK_ARG(validRingBytes(opt_.ringBytes),
                 "shared-memory ring size {} must be a power of two between 4 KiB and 1 GiB", opt_.ringBytes);
  listenFd_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!listenFd_) fail(ecclSystemError, "shared memory: socket(AF_UNIX): {}", strerror(errno));
  // 64 random bits: unique among the namespace's live listeners whatever
  // ids two jobs chose (a clash fails bind, it never aliases), and short:
  // the address travels in NCCL's 128-byte handles.
  uint64_t nonce;
  randomBytes(&nonce, sizeof(nonce));
  socketName_ = fmt::format("eccl-{:016x}", nonce);
  socklen_t len;
  sockaddr_un a = abstractAddress(socketName_, &len);
  if (::bind(listenFd_.get(), reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(listenFd_.get(), 512) != 0)
    fail(ecclSystemError, "shared memory: listening on @{}: {}", socketName_, strerror(errno));
}

Fd ShmBackend::dial(MemberId, const std::string& address, Deadline deadline, const std::string& what,
                    const std::function<bool()>& giveUp) {
  if (address.empty() || address.size() >= sizeof(sockaddr_un::sun_path) - 1)
    fail(ecclInvalidArgument, "{}: '{}' is not a shared-memory address", what, address);
  socklen_t len;
  sockaddr_un a = abstractAddress(address, &len);
  for (;;) {
    Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd) fail(ecclSystemError, "{}: socket(AF_UNIX): {}", what, strerror(errno));
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), len) == 0) return fd;
    // The member's listener exists from before anyone learns its address,
    // so a missing name means another host or network namespace.
    if (errno == ECONNREFUSED || errno == ENOENT) return Fd();
    if (errno != EAGAIN && errno != EINTR) fail(ecclRemoteError, "{}: connect: {}", what, strerror(errno));
    // A full backlog: the member is busy accepting; try again shortly.
    if (Clock::now() >= deadline) fail(ecclTimeout, "{}: the member's local socket stays busy", what);
    if (giveUp && giveUp()) fail(ecclRemoteError, "{}: gave up", what);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

Fd ShmBackend::accept(std::string* from) {
  int fd = ::accept4(listenFd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return Fd();
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (from) {
    *from = getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 ? fmt::format("local process {}", cred.pid)
                                                                       : std::string("a local process");
  }
  return Fd(fd);
}

std::unique_ptr<Conduit> ShmBackend::openDialed(Fd stream, Deadline deadline, const std::string& what) {
  const size_t ring = Ring::footprint(opt_.ringBytes);
  Segment segment = Segment::create(fmt::format("eccl-shm-{:x}", opt_.self), 2 * ring);
  auto* base = static_cast<unsigned char*>(segment.data());
  Ring* tx = Ring::create(base, opt_.ringBytes);
  Ring* rx = Ring::create(base + ring, opt_.ringBytes);
  SegmentAnnouncement hello{kSegmentMagic, opt_.ringBytes};
  sendFd(stream.get(), segment.fd(), &hello, sizeof(hello), deadline, what);
  return std::make_unique<ShmConduit>(std::move(stream), std::move(segment), tx, rx);
}

std::unique_ptr<Conduit> ShmBackend::openAccepted(Fd stream, Deadline deadline, const std::string& what) {
  SegmentAnnouncement hello{};
  Fd fd = recvFd(stream.get(), &hello, sizeof(hello), deadline, what);
  if (hello.magic != kSegmentMagic || !validRingBytes(hello.ringBytes))
    fail(ecclRemoteError, "{}: malformed shared-memory announcement (magic {:#x}, ring {} bytes)", what, hello.magic,
         hello.ringBytes);
  const size_t ring = Ring::footprint(hello.ringBytes);
  Segment segment = Segment::map(std::move(fd), 2 * ring);
  auto* base = static_cast<unsigned char*>(segment.data());
  Ring* rx = Ring::attach(base, hello.ringBytes);
  Ring* tx = Ring::attach(base + ring, hello.ringBytes);
  return std::make_unique<ShmConduit>(std::move(stream), std::move(segment), tx, rx);
}

BackendSpec backendSpec() {
  return {"shm", /*reachesOtherHosts=*/false,
          [](const BackendOptions& o) -> std::unique_ptr<Backend> { return std::make_unique<ShmBackend>(o); }};
}

}  // namespace eccl::transport::shm
