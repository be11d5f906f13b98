// The shared-memory lane as the device sees it (Conduit): bulk frames are
// admitted only while the ring holds little unread, and the reader's reads
// wake a writer that waits for that; a sender copies large chunks straight
// into the peer only where the kernel lets it.
#include <gtest/gtest.h>

#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>

#include <algorithm>
#include <future>
#include <vector>

#include "common/clock.h"
#include "transport/backend.h"
#include "transport/conduit.h"

namespace eccl::transport {
namespace {

std::unique_ptr<Backend> shmBackend(MemberId self, size_t zeroCopyBytes = 0) {
  for (const BackendSpec& spec : registeredBackends())
    if (std::string(spec.name) == "shm") {
      BackendOptions options;
      options.self = self;
      options.ringBytes = 1 << 20;
      options.shmZeroCopyBytes = zeroCopyBytes;
      return spec.create(options);
    }
  return nullptr;
}

bool readableWithin(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, ms) == 1;
}

TEST(ShmConduit, BulkWaitsForTheRingToDrainAndTheReadsWakeItsWriter) {
  auto listener = shmBackend(1), dialer = shmBackend(2);
  ASSERT_TRUE(listener && dialer);
  const auto deadline = deadlineAfterMs(5000);
  Fd stream = dialer->dial(1, listener->address(), deadline, "test dial", nullptr);
  ASSERT_TRUE(stream);
  Fd accepted;
  while (!(accepted = listener->accept(nullptr)) && Clock::now() < deadline) readableWithin(listener->listenFd(), 10);
  ASSERT_TRUE(accepted);
  // The dialer waits for the acceptor's word that it mapped the segment.
  auto dialed = std::async(std::launch::async, [&] { return dialer->openDialed(std::move(stream), deadline, "test writer"); });
  auto reader = listener->openAccepted(std::move(accepted), deadline, "test reader");
  auto writer = dialed.get();

  EXPECT_TRUE(writer->roomForBulk()) << "an empty ring refuses bulk";
  EXPECT_FALSE(writer->armBulkWakeup()) << "an empty ring lets a bulk writer sleep";
  std::vector<uint8_t> bytes(192 << 10, 0x5a), sink(bytes.size());
  iovec iov{bytes.data(), bytes.size()};
  ASSERT_EQ(writer->write(&iov, 1), static_cast<ssize_t>(bytes.size()));
  EXPECT_FALSE(writer->roomForBulk()) << "192 KiB unread of a 1 MiB ring still admits bulk";
  EXPECT_TRUE(writer->armBulkWakeup());
  EXPECT_FALSE(readableWithin(writer->pollFd(), 50)) << "woken with nothing read";

  size_t read = 0;
  while (read < bytes.size() - (16 << 10)) {
    ssize_t n = reader->read(sink.data(), bytes.size() - (16 << 10) - read);
    ASSERT_GT(n, 0);
    read += static_cast<size_t>(n);
  }
  EXPECT_TRUE(readableWithin(writer->pollFd(), 5000)) << "the reader's reads did not wake the waiting writer";
  writer->onPollReady();
  EXPECT_TRUE(writer->roomForBulk()) << "16 KiB unread still refuses bulk";
  EXPECT_TRUE(std::all_of(sink.begin(), sink.begin() + static_cast<ptrdiff_t>(read), [](uint8_t b) { return b == 0x5a; }));
}

// What a container's seccomp profile does to process_vm_writev: EPERM.
void forbidWritingIntoOtherProcesses() {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_writev, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog program{static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) _exit(90);
}

bool readExactly(int fd, void* into, size_t bytes) {
  auto* p = static_cast<char*>(into);
  while (bytes > 0) {
    if (!readableWithin(fd, 10000)) return false;
    ssize_t n = ::read(fd, p, bytes);
    if (n <= 0) return false;
    p += n, bytes -= static_cast<size_t>(n);
  }
  return true;
}

// A child the kernel forbids to write into other processes (seccomp) and a
// parent it allows: the parent's large chunks go straight into the child's
// buffer, the child's pin nothing (so they take the ring), and each side
// counts its lane as it is.
TEST(ShmConduit, OnlyASenderTheKernelLetsWriteIntoItsPeerCopiesOnce) {
  constexpr size_t kBytes = 1 << 20;
  int up[2], down[2];  // child -> parent, parent -> child
  ASSERT_EQ(pipe(up), 0);
  ASSERT_EQ(pipe(down), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    forbidWritingIntoOtherProcesses();
    auto backend = shmBackend(1, 64 << 10);
    std::string address = backend->address();
    uint32_t length = static_cast<uint32_t>(address.size());
    if (::write(up[1], &length, 4) != 4 || ::write(up[1], address.data(), length) != length) _exit(91);
    Fd accepted;
    const auto deadline = deadlineAfterMs(10000);
    while (!(accepted = backend->accept(nullptr)) && Clock::now() < deadline) readableWithin(backend->listenFd(), 10);
    if (!accepted) _exit(92);
    auto lane = backend->openAccepted(std::move(accepted), deadline, "test child");
    std::vector<uint8_t> into(kBytes, 0);
    if (lane->pin(into.data(), kBytes) != 0) _exit(93);  // refused: the ring carries its chunks
    BackendCounters c = backend->counters();
    if (c.singleCopyRefused != 1 || c.singleCopyLanes != 0) _exit(94);
    auto window = lane->expose(into.data(), kBytes);
    if (!window || ::write(up[1], &window->address, 8) != 8) _exit(95);
    char done = 0;
    if (!readExactly(down[0], &done, 1)) _exit(96);
    for (size_t i = 0; i < kBytes; ++i)
      if (into[i] != static_cast<uint8_t>(i * 31 + 7)) _exit(97);
    _exit(0);
  }
  auto backend = shmBackend(2, 64 << 10);
  uint32_t length = 0;
  ASSERT_TRUE(readExactly(up[0], &length, 4));
  std::string address(length, '\0');
  ASSERT_TRUE(readExactly(up[0], address.data(), length));
  const auto deadline = deadlineAfterMs(10000);
  Fd stream = backend->dial(1, address, deadline, "test dial", nullptr);
  ASSERT_TRUE(stream);
  auto lane = backend->openDialed(std::move(stream), deadline, "test parent");
  EXPECT_EQ(backend->counters().singleCopyLanes, 1u);
  EXPECT_EQ(backend->counters().singleCopyRefused, 0u);
  std::vector<uint8_t> from(kBytes);
  for (size_t i = 0; i < kBytes; ++i) from[i] = static_cast<uint8_t>(i * 31 + 7);
  const uint64_t pinned = lane->pin(from.data(), kBytes);
  EXPECT_NE(pinned, 0u) << "the parent may write into its child";
  uint64_t window = 0;
  ASSERT_TRUE(readExactly(up[0], &window, 8));
  EXPECT_TRUE(lane->writeZeroCopy(pinned, from.data(), kBytes, window, 0));
  EXPECT_EQ(lane->zeroCopyWritesDone(), 1u);
  EXPECT_EQ(backend->counters().singleCopyBytes, kBytes);
  char done = 1;
  ASSERT_EQ(::write(down[1], &done, 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status
                                                            << " (90 seccomp, 93 pinned anyway, 94 counters, 97 data)";
}

}  // namespace
}  // namespace eccl::transport
