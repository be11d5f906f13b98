#include "transport/shm/segment.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "common/error.h"

namespace eccl::transport::shm {

Segment Segment::create(const std::string& name, size_t bytes) {
  Segment s;
  s.fd_.reset(memfd_create(name.c_str(), MFD_CLOEXEC));
  if (!s.fd_) fail(ecclSystemError, "memfd_create({}): {}", name, strerror(errno));
  if (ftruncate(s.fd_.get(), static_cast<off_t>(bytes)) != 0)
    fail(ecclSystemError, "sizing shared segment {} to {} bytes: {}", name, bytes, strerror(errno));
  s.data_ = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd_.get(), 0);
  if (s.data_ == MAP_FAILED) {
    s.data_ = nullptr;
    fail(ecclSystemError, "mapping shared segment {} ({} bytes): {}", name, bytes, strerror(errno));
  }
  s.bytes_ = bytes;
  return s;
}

Segment Segment::map(Fd fd, size_t expectedBytes) {
  struct stat st{};
  if (fstat(fd.get(), &st) != 0) fail(ecclSystemError, "shared segment: fstat: {}", strerror(errno));
  if (static_cast<size_t>(st.st_size) != expectedBytes)
    fail(ecclRemoteError, "shared segment holds {} bytes, {} were announced", st.st_size, expectedBytes);
  Segment s;
  s.fd_ = std::move(fd);
  s.data_ = mmap(nullptr, expectedBytes, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd_.get(), 0);
  if (s.data_ == MAP_FAILED) {
    s.data_ = nullptr;
    fail(ecclSystemError, "mapping a peer's shared segment ({} bytes): {}", expectedBytes, strerror(errno));
  }
  s.bytes_ = expectedBytes;
  return s;
}

bool Segment::prefault(size_t offset, size_t bytes) const {
  if (offset >= bytes_) return true;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t from = offset / page * page;
  const size_t to = std::min(bytes_, offset + bytes);
  return madvise(static_cast<char*>(data_) + from, to - from, MADV_POPULATE_WRITE) == 0;
}

Segment::Segment(Segment&& o) noexcept
    : fd_(std::move(o.fd_)), data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    if (data_) munmap(data_, bytes_);
    fd_ = std::move(o.fd_);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

Segment::~Segment() {
  if (data_) munmap(data_, bytes_);
}

namespace {

void awaitSocket(int socket, short events, Deadline deadline, const std::string& what) {
  for (;;) {
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (ms <= 0) fail(ecclTimeout, "{}: timed out", what);
    pollfd p{socket, events, 0};
    int rc = poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, 1000)));
    if (rc > 0) return;
    if (rc < 0 && errno != EINTR) fail(ecclSystemError, "{}: poll: {}", what, strerror(errno));
  }
}

}  // namespace

void sendFd(int socket, int fd, const void* payload, size_t bytes, Deadline deadline, const std::string& what) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  iovec iov{const_cast<void*>(payload), bytes};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  for (;;) {
    awaitSocket(socket, POLLOUT, deadline, what);
    ssize_t rc = sendmsg(socket, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (rc == static_cast<ssize_t>(bytes)) return;
    if (rc >= 0) fail(ecclRemoteError, "{}: the descriptor's message was cut short ({} of {} bytes)", what, rc, bytes);
    if (errno != EAGAIN && errno != EINTR) fail(ecclRemoteError, "{}: sending a descriptor: {}", what, strerror(errno));
  }
}

Fd recvFd(int socket, void* payload, size_t bytes, Deadline deadline, const std::string& what) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  iovec iov{payload, bytes};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  for (;;) {
    awaitSocket(socket, POLLIN, deadline, what);
    ssize_t rc = recvmsg(socket, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (rc < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (rc < 0) fail(ecclRemoteError, "{}: receiving a descriptor: {}", what, strerror(errno));
    if (rc == 0) fail(ecclRemoteError, "{}: the peer closed the socket before sending its segment", what);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    if (static_cast<size_t>(rc) != bytes || !c || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS ||
        (msg.msg_flags & (MSG_CTRUNC | MSG_TRUNC)))
      fail(ecclRemoteError, "{}: expected a descriptor with {} bytes, got {} bytes{}", what, bytes, rc,
           c ? "" : " and no descriptor");
    int fd;
    std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
    return Fd(fd);
  }
}

}  // namespace eccl::transport::shm
