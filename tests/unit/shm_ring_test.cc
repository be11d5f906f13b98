// The shared-memory back end's lane: a byte ring two processes share
// through a memfd handed over a Unix socket, futex sleeps and wakeups.
#include "transport/shm/ring.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "common/error.h"
#include "transport/shm/segment.h"

namespace eccl::transport::shm {
namespace {

uint8_t streamByte(uint64_t i) { return static_cast<uint8_t>((i * 2654435761u) >> 13); }

// The /dev/shm entries whose name holds `part`: other processes' names
// (Python's semaphores of the torch tests running beside, say) come and go.
std::set<std::string> devShm(const std::string& part) {
  std::set<std::string> names;
  for (auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    std::string name = e.path().filename();
    if (name.find(part) != std::string::npos) names.insert(name);
  }
  return names;
}

// The child writes `total` bytes of a known stream in random pieces into
// a 4 KiB ring (so it wraps and both sides sleep); the parent reads it in
// other random pieces and checks every byte.
TEST(ShmRing, StreamsBetweenTwoProcessesThroughAPassedMemfd) {
  const auto before = devShm("eccl-test-ring");
  constexpr size_t kCapacity = 4096, kTotal = 8 << 20;
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  pid_t child = fork();
  if (child == 0) {
    close(sv[0]);
    try {
      uint64_t bytes = 0;
      Fd fd = recvFd(sv[1], &bytes, sizeof(bytes), deadlineAfterMs(5000), "child");
      Segment seg = Segment::map(std::move(fd), bytes);
      Ring* ring = Ring::attach(seg.data(), kCapacity);
      std::mt19937 rng(1);
      std::vector<uint8_t> piece(3 * kCapacity);
      for (uint64_t sent = 0; sent < kTotal;) {
        size_t n = std::min<size_t>(kTotal - sent, 1 + rng() % piece.size());
        for (size_t i = 0; i < n; ++i) piece[i] = streamByte(sent + i);
        for (size_t done = 0; done < n;) {
          ring->waitWritable(deadlineAfterMs(5000), 5);
          size_t w = ring->write(piece.data() + done, n - done);
          if (w == 0) _exit(3);  // timed out: nobody reads
          done += w;
        }
        sent += n;
      }
      _exit(0);
    } catch (const std::exception& e) {
      fprintf(stderr, "child: %s\n", e.what());
      _exit(2);
    }
  }
  close(sv[1]);
  Segment seg = Segment::create("eccl-test-ring", Ring::footprint(kCapacity));
  Ring* ring = Ring::create(seg.data(), kCapacity);
  uint64_t bytes = seg.size();
  sendFd(sv[0], seg.fd(), &bytes, sizeof(bytes), deadlineAfterMs(5000), "parent");
  std::mt19937 rng(2);
  std::vector<uint8_t> piece(2 * kCapacity);
  uint64_t got = 0, wrong = 0;
  while (got < kTotal) {
    ring->waitReadable(deadlineAfterMs(5000), 5);
    size_t n = ring->read(piece.data(), std::min<size_t>(kTotal - got, 1 + rng() % piece.size()));
    ASSERT_GT(n, 0u) << "nothing arrived within 5 s after " << got << " bytes";
    for (size_t i = 0; i < n; ++i) wrong += piece[i] != streamByte(got + i);
    got += n;
  }
  EXPECT_EQ(wrong, 0u);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  close(sv[0]);
  EXPECT_EQ(devShm("eccl-test-ring"), before) << "a segment left a name in /dev/shm";
}

TEST(ShmRing, ASleeperWakesAtTheDeadlineOrWhenClosed) {
  Segment seg = Segment::create("eccl-test-ring", Ring::footprint(4096));
  Ring* ring = Ring::create(seg.data(), 4096);
  auto start = Clock::now();
  ring->waitReadable(deadlineAfterMs(120), 0);
  auto waited = Clock::now() - start;
  EXPECT_GE(waited, std::chrono::milliseconds(110));
  EXPECT_LT(waited, std::chrono::milliseconds(1000));
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    ring->markClosed();
  });
  start = Clock::now();
  ring->waitReadable(deadlineAfterMs(10000), 0);
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(2000));
  EXPECT_TRUE(ring->closed());
  closer.join();
}

TEST(ShmRing, AFullRingTakesNothingAndAttachChecksTheLayout) {
  Segment seg = Segment::create("eccl-test-ring", Ring::footprint(4096));
  EXPECT_THROW(Ring::attach(seg.data(), 4096), Error);  // nothing laid out yet
  Ring* ring = Ring::create(seg.data(), 4096);
  EXPECT_THROW(Ring::attach(seg.data(), 8192), Error);
  std::vector<uint8_t> block(5000, 7);
  EXPECT_EQ(ring->write(block.data(), block.size()), 4096u);
  EXPECT_EQ(ring->write(block.data(), 1), 0u);
  EXPECT_EQ(ring->writable(), 0u);
  EXPECT_EQ(ring->read(block.data(), 100), 100u);
  EXPECT_EQ(ring->writable(), 100u);
  EXPECT_THROW(Ring::create(seg.data(), 3000), Error);
}

// A segment's pages are allocated on first touch, and prefault allocates
// exactly the range it is given (mincore: resident in the memory file).
TEST(ShmSegment, PagesComeOnFirstTouchOrWherePrefaulted) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  Segment seg = Segment::create("eccl-test-segment", 64 * page);
  auto resident = [&] {
    std::vector<unsigned char> v(64);
    EXPECT_EQ(mincore(seg.data(), seg.size(), v.data()), 0) << strerror(errno);
    std::vector<int> pages;
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i] & 1) pages.push_back(static_cast<int>(i));
    return pages;
  };
  EXPECT_TRUE(resident().empty()) << "nothing is allocated when the segment is made";
  static_cast<volatile char*>(seg.data())[5 * page] = 1;
  EXPECT_EQ(resident(), std::vector<int>({5}));
  if (!seg.prefault(40 * page + 1, 3 * page)) {
    // Before Linux 5.14 (no MADV_POPULATE_WRITE) nothing is prefaulted and
    // the pages keep coming on first touch, which is what the lanes rely on.
    EXPECT_EQ(resident(), std::vector<int>({5})) << "a refused prefault allocated nothing";
    return;
  }
  EXPECT_EQ(resident(), std::vector<int>({5, 40, 41, 42, 43})) << "from the page holding the offset to the end";
  EXPECT_EQ(static_cast<volatile char*>(seg.data())[5 * page], 1) << "what was written stays";
  EXPECT_TRUE(seg.prefault(62 * page, 10 * page)) << "clipped at the segment's end";
  EXPECT_EQ(resident().back(), 63);
}

}  // namespace
}  // namespace eccl::transport::shm
