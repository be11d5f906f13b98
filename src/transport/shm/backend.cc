#include "transport/shm/backend.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>

#include "common/crypto.h"
#include "common/error.h"
#include "common/log.h"
#include "transport/shm/ring.h"
#include "transport/shm/segment.h"

namespace eccl::transport::shm {
namespace {

constexpr uint64_t kSegmentMagic = 0x4d48534c4343434aull;  // "ECCLSHM" + version 6 (16 KiB fast slots)

struct SegmentAnnouncement {
  uint64_t magic;
  uint64_t ringBytes;
};

// The page after the two rings: where each side mapped the segment, so the
// other can try a process_vm_writev into it and read the result back in its
// own mapping of the same page (no help from the peer needed).
// The acceptor's word that it mapped the segment (and said where).
constexpr uint64_t kMappedAck = 0x4b43414d4c434345ull;

struct CrossMemoryPage {
  std::atomic<uint64_t> mappedAt[2];  // 0: the dialer, 1: the acceptor; 0 until mapped
  std::atomic<uint64_t> probe[2];     // side i's write into the other's mapping lands here
};
static_assert(sizeof(CrossMemoryPage) <= 4096);
constexpr size_t kCrossMemoryPageBytes = 4096;

// Layout: the dialer's ring to the acceptor, the acceptor's ring back, the
// dialer's fast slots, the acceptor's, the cross-memory page.
size_t segmentBytes(uint64_t ringBytes) {
  return 2 * Ring::footprint(ringBytes) + 2 * FastChannel::footprint() + kCrossMemoryPageBytes;
}
unsigned char* fastSlots(const Segment& segment, uint64_t ringBytes, int side) {
  return static_cast<unsigned char*>(segment.data()) + 2 * Ring::footprint(ringBytes) +
         static_cast<size_t>(side) * FastChannel::footprint();
}
// The rings' pages come on first touch (shm/segment.h); what follows them,
// the slots every small message's first lap would fault in and the
// cross-memory page, is mapped as the lane opens, on both sides.
void prefaultPastTheRings(const Segment& segment, uint64_t ringBytes) {
  const size_t rings = 2 * Ring::footprint(ringBytes);
  segment.prefault(rings, segment.size() - rings);
}
CrossMemoryPage* crossMemoryPage(const Segment& segment) {
  return reinterpret_cast<CrossMemoryPage*>(static_cast<unsigned char*>(segment.data()) + segment.size() -
                                            kCrossMemoryPageBytes);
}

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
  ShmConduit(Fd doorbell, Segment segment, uint64_t ringBytes, Ring* tx, Ring* rx, int side, size_t zeroCopyBytes,
             bool unlockedWrites, bool peerReads, std::shared_ptr<ShmCounters> counters)
      : doorbell_(std::move(doorbell)),
        segment_(std::make_shared<Segment>(std::move(segment))),
        ringBytes_(ringBytes),
        tx_(tx),
        rx_(rx),
        page_(crossMemoryPage(*segment_)),
        side_(side),
        zeroCopyBytes_(zeroCopyBytes),
        unlockedWrites_(unlockedWrites),
        counters_(std::move(counters)) {
    setNonBlocking(doorbell_.get(), true);
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (getsockopt(doorbell_.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) peerPid_ = cred.pid;
    if (zeroCopyBytes_ > 0) probeCrossMemory();
    if (peerReads) probePeerReads();
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
    if (broken_) {
      errno = EIO;
      return -1;
    }
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

  // The read side touches only the receive ring, its writer arm and the
  // doorbell socket (one send), and the two flags below.
  bool readsBesideCalls() const override { return true; }

  ssize_t read(void* into, size_t n) override {
    if (broken_) {
      errno = EIO;
      return -1;
    }
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

  // Single copy for large chunks (the device's rendezvous, as over RDMA):
  // the sender writes straight into the receiver's buffer with
  // process_vm_writev, where the kernel lets this process write into the
  // peer's (same user, no seccomp or Yama rule against it: tried once per
  // lane as it opens, counted either way). A receiver exposes any memory:
  // its address is the window. A sender that may not write pins nothing,
  // and its chunks come through the ring.
  size_t zeroCopyMinBytes() const override { return zeroCopyBytes_; }
  std::optional<Window> expose(void* buffer, size_t) override {
    return Window{reinterpret_cast<uint64_t>(buffer), 0, ++handles_};
  }
  uint64_t pin(const void*, size_t) override { return mayWritePeer_ ? ++handles_ : 0; }
  bool writeZeroCopy(uint64_t, const void* buffer, size_t bytes, uint64_t address, uint32_t) override {
    if (!writeIntoPeer(buffer, bytes, address)) {
      broken_ = true;  // the next write() or read() breaks the lane, naming failure()
      return true;
    }
    writesDone_.fetch_add(1, std::memory_order_release);
    counters_->singleCopyBytes.fetch_add(bytes, std::memory_order_relaxed);
    return true;
  }
  uint64_t zeroCopyWritesDone() const override { return writesDone_.load(std::memory_order_acquire); }
  // process_vm_writev copies in the call: the device releases its lock
  // around it. The write side shares with the others only the atomics and
  // the failure text (its own lock).
  bool writesZeroCopyBesideCalls() const override { return unlockedWrites_; }
  std::string failure() const override {
    std::lock_guard<std::mutex> lock(failureMu_);
    return writeFailure_;
  }

  std::shared_ptr<FastChannel> fastChannel() override {
    if (!fast_) {
      Ring* tx = tx_;
      Ring* rx = rx_;
      fast_ = std::make_shared<FastChannel>(segment_, fastSlots(*segment_, ringBytes_, side_),
                                            fastSlots(*segment_, ringBytes_, 1 - side_),
                                            [tx, rx] { return tx->closed() || rx->closed(); },
                                            [rx] { return rx->readable() > 0; });
      fast_->setPeerMemory(peerMemory_);
    }
    return fast_;
  }

 private:
  // Tried once, as the lane opens: a write into the peer's mapping of
  // this segment, read back in ours.
  void probeCrossMemory() {
    const uint64_t peerBase = page_->mappedAt[1 - side_].load(std::memory_order_acquire);
    const uint64_t nonce = (uint64_t{static_cast<uint32_t>(getpid())} << 32) | 0x9e3779b9u;
    const uint64_t slot = inPeersMapping(peerBase, &page_->probe[side_]);
    mayWritePeer_ = peerPid_ > 0 && peerBase != 0 && writeIntoPeer(&nonce, sizeof(nonce), slot) &&
                    page_->probe[side_].load(std::memory_order_acquire) == nonce;
    (mayWritePeer_ ? counters_->singleCopyLanes : counters_->singleCopyRefused).fetch_add(1, std::memory_order_relaxed);
    if (!mayWritePeer_)
      log::info("shared memory: this process may not write into process {} ({}); its large chunks go through the ring",
                peerPid_, failure().empty() ? "the probe did not land" : failure());
    std::lock_guard<std::mutex> lock(failureMu_);
    writeFailure_.clear();
  }

  // Where `field` of this segment lies in the peer, which mapped it at `peerBase`.
  uint64_t inPeersMapping(uint64_t peerBase, const void* field) const {
    return peerBase + (reinterpret_cast<uintptr_t>(field) - reinterpret_cast<uintptr_t>(segment_->data()));
  }

  // Tried once, as the lane opens: the peer's own record of where it
  // mapped this segment, read from its mapping, against ours.
  void probePeerReads() {
    const uint64_t peerBase = page_->mappedAt[1 - side_].load(std::memory_order_acquire);
    if (peerPid_ <= 0 || peerBase == 0) return;
    auto memory = std::make_shared<PeerMemory>(peerPid_);
    const uint64_t at = inPeersMapping(peerBase, &page_->mappedAt[1 - side_]);
    uint64_t seen = 0;
    std::string why;
    if (memory->read(at, &seen, sizeof(seen), &why) && seen == peerBase) {
      peerMemory_ = std::move(memory);
      counters_->peerReadLanes.fetch_add(1, std::memory_order_relaxed);
    } else {
      log::info("shared memory: this process may not read process {}'s memory ({}); same-host collectives copy "
                "through the lanes",
                peerPid_, why.empty() ? "the probe read something else" : why);
    }
  }

  bool writeIntoPeer(const void* buffer, size_t bytes, uint64_t address) {
    std::string why;
    if (PeerMemory(peerPid_).write(address, buffer, bytes, &why)) return true;
    std::lock_guard<std::mutex> lock(failureMu_);
    writeFailure_ = std::move(why);
    return false;
  }

  size_t bulkFillBytes() const { return std::min<size_t>(tx_->capacity(), 256 << 10) / 4; }

  // A full socket buffer already holds a doorbell the peer has not taken.
  void ring() {
    char one = 1;
    [[maybe_unused]] ssize_t rc = ::send(doorbell_.get(), &one, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
  }

  Fd doorbell_;
  // Shared with the fast channel, which may outlive the lane.
  std::shared_ptr<Segment> segment_;
  uint64_t ringBytes_;
  std::shared_ptr<FastChannel> fast_;
  Ring* tx_;
  Ring* rx_;
  CrossMemoryPage* page_;
  int side_;
  size_t zeroCopyBytes_;
  bool unlockedWrites_;
  std::shared_ptr<ShmCounters> counters_;
  pid_t peerPid_ = 0;
  bool mayWritePeer_ = false;
  std::shared_ptr<const PeerMemory> peerMemory_;  // null: the probe read failed
  uint64_t handles_ = 0;
  std::atomic<uint64_t> writesDone_{0};
  mutable std::mutex failureMu_;
  std::string writeFailure_;
  // Set by write-side calls and onPollReady, read by read(), which may run
  // on another thread (readsBesideCalls).
  std::atomic<bool> broken_{false};
  std::atomic<bool> peerGone_{false};
};

}  // namespace

BackendCounters ShmBackend::counters() const {
  BackendCounters c;
  c.singleCopyLanes = counters_->singleCopyLanes.load(std::memory_order_relaxed);
  c.singleCopyRefused = counters_->singleCopyRefused.load(std::memory_order_relaxed);
  c.singleCopyBytes = counters_->singleCopyBytes.load(std::memory_order_relaxed);
  c.peerReadLanes = counters_->peerReadLanes.load(std::memory_order_relaxed);
  return c;
}

// The kernel lists this network namespace's listening unix sockets in
// /proc/net/unix, abstract names with a leading '@': found there, the
// member can be dialed over shared memory (and it finds this one there too).
bool ShmBackend::listensHere(const std::string& part) const {
  if (part.empty()) return false;
  std::ifstream table("/proc/net/unix");
  const std::string wanted = "@" + part;
  std::string line;
  while (std::getline(table, line)) {
    const size_t at = line.rfind(' ');
    if (at != std::string::npos && line.compare(at + 1, std::string::npos, wanted) == 0) return true;
  }
  return false;
}

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
  Segment segment = Segment::create(fmt::format("eccl-shm-{:x}", opt_.self), segmentBytes(opt_.ringBytes));
  prefaultPastTheRings(segment, opt_.ringBytes);
  auto* base = static_cast<unsigned char*>(segment.data());
  Ring* tx = Ring::create(base, opt_.ringBytes);
  Ring* rx = Ring::create(base + ring, opt_.ringBytes);
  FastChannel::create(fastSlots(segment, opt_.ringBytes, 0));
  FastChannel::create(fastSlots(segment, opt_.ringBytes, 1));
  crossMemoryPage(segment)->mappedAt[0].store(reinterpret_cast<uint64_t>(base), std::memory_order_release);
  SegmentAnnouncement hello{kSegmentMagic, opt_.ringBytes};
  sendFd(stream.get(), segment.fd(), &hello, sizeof(hello), deadline, what);
  uint64_t ack = 0;
  recvAll(stream.get(), &ack, sizeof(ack), deadline, what);
  if (ack != kMappedAck) fail(ecclRemoteError, "{}: malformed shared-memory acknowledgement ({:#x})", what, ack);
  return std::make_unique<ShmConduit>(std::move(stream), std::move(segment), opt_.ringBytes, tx, rx, 0,
                                      opt_.shmZeroCopyBytes, opt_.shmUnlockedWrites, opt_.shmPeerReads, counters_);
}

std::unique_ptr<Conduit> ShmBackend::openAccepted(Fd stream, Deadline deadline, const std::string& what) {
  SegmentAnnouncement hello{};
  Fd fd = recvFd(stream.get(), &hello, sizeof(hello), deadline, what);
  if (hello.magic != kSegmentMagic || !validRingBytes(hello.ringBytes))
    fail(ecclRemoteError, "{}: malformed shared-memory announcement (magic {:#x}, ring {} bytes)", what, hello.magic,
         hello.ringBytes);
  const size_t ring = Ring::footprint(hello.ringBytes);
  Segment segment = Segment::map(std::move(fd), segmentBytes(hello.ringBytes));
  prefaultPastTheRings(segment, hello.ringBytes);
  auto* base = static_cast<unsigned char*>(segment.data());
  Ring* rx = Ring::attach(base, hello.ringBytes);
  Ring* tx = Ring::attach(base + ring, hello.ringBytes);
  crossMemoryPage(segment)->mappedAt[1].store(reinterpret_cast<uint64_t>(base), std::memory_order_release);
  sendAll(stream.get(), &kMappedAck, sizeof(kMappedAck), deadline, what);
  return std::make_unique<ShmConduit>(std::move(stream), std::move(segment), hello.ringBytes, tx, rx, 1,
                                      opt_.shmZeroCopyBytes, opt_.shmUnlockedWrites, opt_.shmPeerReads, counters_);
}

BackendSpec backendSpec() {
  return {"shm", /*reachesOtherHosts=*/false,
          [](const BackendOptions& o) -> std::unique_ptr<Backend> { return std::make_unique<ShmBackend>(o); }};
}

}  // namespace eccl::transport::shm
