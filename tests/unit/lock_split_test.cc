// The device copies a large payload into a posted receive with its lock
// released (Conduit::readsBesideCalls). A read that sleeps first
// (addSlowRead, tests/support/fault_backend.h) holds that copy open on
// purpose while another thread receives on another lane, cancels the
// receive, fails the peer or removes it: over tcp and shm.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "tests/support/fault_backend.h"
#include "transport/device.h"

namespace eccl::test {
namespace {

using transport::Request;
using transport::RequestPtr;

constexpr int kSleepMs = 400;
// Where the test asserts what happened meanwhile: long enough for that to
// happen on a loaded machine (under ASan beside the main job, a small
// exchange once took longer than 400 ms).
constexpr int kLongSleepMs = 3000;
constexpr size_t kBig = 192 << 10;       // one frame: below the stripe threshold (256 KiB)
constexpr size_t kSlowFrom = 64 << 10;  // only a direct payload read asks this much

struct Pair {
  std::unique_ptr<transport::Device> a, b;  // a sends, b receives
  explicit Pair(const std::string& backend, int lanes, int64_t copyHelpBytes = 0, size_t shmZeroCopyBytes = 0) {
    transport::DeviceOptions o = faultDeviceOptions(backend, lanes, 12);
    o.copyHelpBytes = copyHelpBytes;
    o.shmZeroCopyBytes = shmZeroCopyBytes;
    o.shmUnlockedWrites = true;
    allowZeroCopy(shmZeroCopyBytes > 0);
    a = transport::createDevice(o);
    o.self = 1;
    b = transport::createDevice(o);
    a->addPeer(1, b->address(), "rank 1");
    b->addPeer(0, a->address(), "rank 0");
    a->setEpoch(1);
    b->setEpoch(1);
  }
  ~Pair() { clearFaults(); }
};

std::vector<uint8_t> pattern(size_t bytes, uint32_t seed) { return patternBytes(bytes, seed); }

// Every lane open and counted: one small message through each.
void warm(Pair& p, int lanes) {
  for (int i = 0; i < lanes; ++i) {
    std::vector<uint8_t> out = pattern(64, 7), in(64);
    auto r = p.b->irecv(0, 1, static_cast<uint32_t>(i), in.data(), in.size());
    auto s = p.a->isend(1, 1, static_cast<uint32_t>(i), out.data(), out.size());
    p.b->wait(r, deadlineAfterMs(5000), "warm recv");
    p.a->wait(s, deadlineAfterMs(5000), "warm send");
    ASSERT_EQ(in, out);
  }
}

bool awaitSlowReadBegun(int before) {
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (slowReadsBegun() == before && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return slowReadsBegun() > before;
}

// Polls the request with test(), which drives nothing, until it ends (10 s
// at most); what it failed with, empty when it completed.
std::string watch(transport::Device& d, const RequestPtr& r, const char* what) {
  const auto until = Clock::now() + std::chrono::seconds(10);
  try {
    while (!d.test(r, what) && Clock::now() < until) std::this_thread::sleep_for(std::chrono::microseconds(200));
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

// The big message's receive, watched from its own thread by test(), which
// drives nothing: the progress thread does the slow read, so the receive's
// end is seen as soon as the device says it, not when a driving waiter's
// own read returns. What it said, and whether the slow read had ended.
struct BigReceive {
  std::vector<uint8_t> sent = pattern(kBig, 3), got = std::vector<uint8_t>(kBig, 0);
  RequestPtr recv, send;
  std::string error;
  bool readEndedFirst = false;
  std::thread waiter;
  BigReceive(Pair& p, uint64_t seq) {
    recv = p.b->irecv(0, seq, 0, got.data(), got.size());  // posted first: its buffer is the target
    send = p.a->isend(1, seq, 0, sent.data(), sent.size());
    waiter = std::thread([this, &p, ended = slowReadsEnded()] {
      error = watch(*p.b, recv, "big recv");
      readEndedFirst = slowReadsEnded() > ended;
    });
  }
  void join(Pair& p) {
    waiter.join();
    try {
      p.a->wait(send, deadlineAfterMs(5000), "big send");
    } catch (const Error&) {
    }
    if (send->state.load() == Request::kPending) p.a->cancel(send, "test over");
  }
};

// The big receive on one lane, its first copy held open by a slow read.
std::unique_ptr<BigReceive> startHeldCopy(Pair& p) {
  warm(p, 1);
  const int begun = slowReadsBegun();
  addSlowRead(1, kSlowFrom, kSleepMs);
  auto big = std::make_unique<BigReceive>(p, 2);
  EXPECT_TRUE(awaitSlowReadBegun(begun)) << "no copy began";
  return big;
}

class LockSplit : public ::testing::TestWithParam<std::string> {};

TEST_P(LockSplit, AnotherLaneIsReadWhileOneCopiesWithoutTheLock) {
  Pair p(GetParam(), 2);
  warm(p, 2);
  const int begun = slowReadsBegun(), ended = slowReadsEnded();
  addSlowRead(1, kSlowFrom, kLongSleepMs);
  const auto before = p.b->stats().bytesReadUnlocked;
  BigReceive big(p, 2);  // on lane 0 (lane 1 had the last warm-up message)
  ASSERT_TRUE(awaitSlowReadBegun(begun));
  std::vector<uint8_t> out = pattern(4096, 9), in(4096);
  auto r = p.b->irecv(0, 3, 0, in.data(), in.size());
  auto s = p.a->isend(1, 3, 0, out.data(), out.size());
  p.b->wait(r, deadlineAfterMs(5000), "small recv");
  EXPECT_EQ(slowReadsEnded(), ended) << "the small message waited for the other lane's copy";
  EXPECT_EQ(in, out);
  p.a->wait(s, deadlineAfterMs(5000), "small send");
  big.join(p);
  EXPECT_EQ(big.error, "");
  EXPECT_EQ(big.got, big.sent);
  EXPECT_GE(p.b->stats().bytesReadUnlocked - before, kSlowFrom);
}

TEST_P(LockSplit, CancelReturnsOnlyOnceTheCopyLetTheBufferGo) {
  Pair p(GetParam(), 1);
  const int ended = slowReadsEnded();
  auto held = startHeldCopy(p);
  BigReceive& big = *held;
  p.b->cancel(big.recv, "cancelled by the test");
  EXPECT_EQ(slowReadsEnded(), ended + 1) << "cancel returned while the lane still wrote the buffer";
  const std::vector<uint8_t> atCancel = big.got;
  big.join(p);
  EXPECT_NE(big.error.find("cancelled by the test"), std::string::npos) << big.error;
  // The rest of the message is read and dropped, never written here.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(big.got, atCancel);
  // The lane goes on: the next message arrives whole.
  std::vector<uint8_t> out = pattern(kBig, 4), in(kBig);
  auto r = p.b->irecv(0, 3, 0, in.data(), in.size());
  auto s = p.a->isend(1, 3, 0, out.data(), out.size());
  p.b->wait(r, deadlineAfterMs(5000), "next recv");
  p.a->wait(s, deadlineAfterMs(5000), "next send");
  EXPECT_EQ(in, out);
}

// The verdict first reads what the peer sent (docs/transport.md): the copy
// under way ends, then the lane is read until it is empty, or for a socket
// until it stays quiet. This sender is alive, so over a socket the rest of
// the message may still come and complete it; through a ring smaller than
// the message it cannot. Either way the receive ends only after the copy,
// whole or failed with the verdict.
TEST_P(LockSplit, APeerFailedDuringTheCopyEndsTheReceiveOnlyOnceTheCopyEnds) {
  Pair p(GetParam(), 1);
  auto held = startHeldCopy(p);
  BigReceive& big = *held;
  p.b->failPeer(0, ecclRemoteError, "rank 0 declared failed by the test");
  big.join(p);
  if (big.error.empty())
    EXPECT_EQ(big.got, big.sent) << "the receive completed without all its bytes";
  else
    EXPECT_NE(big.error.find("declared failed by the test"), std::string::npos) << big.error;
  EXPECT_TRUE(big.readEndedFirst) << "the receive ended while its buffer was still being written";
  EXPECT_FALSE(p.b->hasPeer(0));
}

// The lane itself is destroyed while its copy runs: the reader must not
// touch it after (the ASan build sees a use after free).
TEST_P(LockSplit, APeerRemovedDuringTheCopyEndsTheReceive) {
  Pair p(GetParam(), 1);
  auto held = startHeldCopy(p);
  BigReceive& big = *held;
  p.b->removePeer(0);
  big.join(p);
  EXPECT_NE(big.error.find("not in the new view"), std::string::npos) << big.error;
  EXPECT_TRUE(big.readEndedFirst) << "the receive ended while its buffer was still being written";
}

// A striped message: the waiting caller copies one lane (held open by the
// slow read) and wakes the progress thread, which copies the other lane
// beside it. Without the help that lane waits for the caller.
TEST_P(LockSplit, TheProgressThreadCopiesTheOtherLanesOfAStripedMessage) {
  Pair p(GetParam(), 2, /*copyHelpBytes=*/64 << 10);
  warm(p, 2);
  const int begun = slowReadsBegun();
  addSlowRead(1, kSlowFrom, kLongSleepMs);
  const size_t bytes = 2 << 20;  // 1 MiB a lane
  std::vector<uint8_t> out = pattern(bytes, 5), in(bytes);
  auto r = p.b->irecv(0, 2, 0, in.data(), in.size());
  std::string error;
  std::thread waiter([&] {
    try {
      p.b->wait(r, deadlineAfterMs(10000), "striped recv");
    } catch (const Error& e) {
      error = e.what();
    }
  });
  // The caller drives before the data comes, so the first copy is its own.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto before = p.b->stats().bytesCopiedByHelper;
  auto s = p.a->isend(1, 2, 0, out.data(), out.size());
  ASSERT_TRUE(awaitSlowReadBegun(begun));
  waiter.join();
  p.a->wait(s, deadlineAfterMs(5000), "striped send");
  EXPECT_EQ(error, "");
  EXPECT_EQ(in, out);
  EXPECT_GE(p.b->stats().bytesCopiedByHelper - before, kSlowFrom);
}

// Shared memory's zero-copy write (process_vm_writev, the sender's one
// copy of a large chunk) runs with the sender's lock released too.
struct HeldZeroCopyWrite {
  Pair p{"fault-shm", 2, 0, /*shmZeroCopyBytes=*/64 << 10};
  std::vector<uint8_t> sent = pattern(kBig, 6), got = std::vector<uint8_t>(kBig, 0);
  RequestPtr recv, send;
  std::string error;
  bool writeEndedFirst = false;
  std::thread sender;
  int ended = 0;
  HeldZeroCopyWrite() {
    warm(p, 2);
    const int begun = slowReadsBegun();
    ended = slowReadsEnded();
    addSlowZeroCopyWrite(0, kLongSleepMs);
    // The send first: had the receive been announced before it, the post
    // itself would write (on this thread, the lock released) and return
    // only once the write ended; the write must run on the progress thread.
    send = p.a->isend(1, 2, 0, sent.data(), sent.size());  // lane 0
    recv = p.b->irecv(0, 2, 0, got.data(), got.size());
    sender = std::thread([this] {
      error = watch(*p.a, send, "big send");
      writeEndedFirst = slowReadsEnded() > ended;
    });
    EXPECT_TRUE(awaitSlowReadBegun(begun)) << "no zero-copy write began";
  }
  void join() {
    sender.join();
    if (recv->state.load() == Request::kPending) p.b->cancel(recv, "test over");
  }
};

TEST(LockSplitZeroCopy, AnotherLaneIsWrittenWhileAZeroCopyWriteRuns) {
  HeldZeroCopyWrite w;
  std::vector<uint8_t> out = pattern(4096, 9), in(4096);
  auto r = w.p.b->irecv(0, 3, 0, in.data(), in.size());
  auto s = w.p.a->isend(1, 3, 0, out.data(), out.size());  // lane 1
  w.p.a->wait(s, deadlineAfterMs(5000), "small send");
  w.p.b->wait(r, deadlineAfterMs(5000), "small recv");
  EXPECT_EQ(slowReadsEnded(), w.ended) << "the small message waited for the other lane's zero-copy write";
  EXPECT_EQ(in, out);
  w.p.b->wait(w.recv, deadlineAfterMs(5000), "big recv");
  w.join();
  EXPECT_EQ(w.error, "");
  EXPECT_EQ(w.got, w.sent);
  EXPECT_EQ(w.p.a->stats().zeroCopyBytesUnlocked, kBig);
}

TEST(LockSplitZeroCopy, CancelReturnsOnlyOnceTheWriteLetTheBufferGo) {
  HeldZeroCopyWrite w;
  w.p.a->cancel(w.send, "send cancelled by the test");
  EXPECT_EQ(slowReadsEnded(), w.ended + 1) << "cancel returned while the buffer was still being written from";
  w.join();
  EXPECT_NE(w.error.find("send cancelled by the test"), std::string::npos) << w.error;
}

TEST(LockSplitZeroCopy, APeerRemovedDuringTheWriteEndsTheSendAfterIt) {
  HeldZeroCopyWrite w;
  w.p.a->removePeer(1);
  w.join();
  EXPECT_NE(w.error.find("not in the new view"), std::string::npos) << w.error;
  EXPECT_TRUE(w.writeEndedFirst) << "the send ended while its buffer was still being written from";
}

INSTANTIATE_TEST_SUITE_P(Over, LockSplit, ::testing::Values("fault-tcp", "fault-shm"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "fault-tcp" ? std::string("tcp") : std::string("shm");
                         });

}  // namespace
}  // namespace eccl::test
