// The device against real sockets and real shared memory: two devices in one
// process over each back end, plus a hand-driven client that authenticates
// and then misbehaves.
#include <gtest/gtest.h>

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>

#include <map>
#include <thread>

#include "membership/handshake.h"
#include "common/error.h"
#include "common/socket.h"
#include "common/crypto.h"
#include "transport/frame.h"
#include "transport/connect.h"
#include "transport/device.h"
#include "transport/backend.h"
#include "tests/support/time_scale.h"

namespace eccl::transport {
namespace {

std::string partOf(const Device& device, const std::string& backend) {
  for (auto& [name, part] : splitAddress(device.address()))
    if (name == backend) return part;
  ADD_FAILURE() << device.address() << " has no " << backend << " part";
  return "";
}

SockAddr tcpAddress(const Device& device) { return SockAddr::parse(partOf(device, "tcp")); }

// The wait on `r` fails because a member left in order ("has left"), and
// names `also` when given.
void expectFailsForALeaver(Device& device, const RequestPtr& r, const std::string& ifNot, const std::string& also = "") {
  try {
    device.wait(r, deadlineAfterMs(5000), "recv");
    ADD_FAILURE() << ifNot;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has left"), std::string::npos) << e.what();
    if (!also.empty()) EXPECT_NE(std::string(e.what()).find(also), std::string::npos) << e.what();
  }
}

// A receive of the wrong size fails as a usage error and nothing of the
// message is written into it (it was filled with 0xEE).
void expectRefusedUntouched(Device& receiver, const RequestPtr& r, const std::vector<uint8_t>& buffer) {
  try {
    receiver.wait(r, deadlineAfterMs(20000), "recv");
    ADD_FAILURE() << "a message of the wrong size was received";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ecclInvalidUsage) << e.what();
  }
  EXPECT_TRUE(std::all_of(buffer.begin(), buffer.end(), [](uint8_t b) { return b == 0xEE; }));
}

// A device on loopback over one back end, of job `job` (secret all ones).
DeviceOptions loopbackOptions(const std::string& backend, uint64_t job, int lanes, MemberId self = 0) {
  DeviceOptions o;
  o.backends = {backend};
  o.jobId = o.commId = job;
  o.secret.fill(1);
  o.lanes = lanes;
  o.ifname = "lo";
  o.self = self;
  return o;
}

struct Pair {
  std::string failure;  // outlives the devices, whose threads may still report
  std::unique_ptr<Device> a, b;
  explicit Pair(int lanes = 2, const std::string& backend = "tcp") {
    DeviceOptions o;
    o.backends = {backend};
    o.ringBytes = 64 << 10;  // small rings: large messages wrap many times
    o.shmZeroCopyBytes = 64 << 10;  // shared memory's single copy, as ECCL_IB_ZERO_COPY_BYTES over verbs
    o.shmUnlockedWrites = true;     // and with the device lock released (ECCL_SHM_UNLOCKED_WRITES)
    o.jobId = 5;
    o.commId = 5;
    o.secret.fill(1);
    o.lanes = lanes;
    o.ifname = "lo";
    o.handshakeTimeoutMs = 2000 * timeScale();  // the first handshake in an emulated VM is the slowest
    o.stripeMinBytes = 4096;
    o.self = 0;
    a = createDevice(o);
    o.self = 1;
    b = createDevice(o);
    a->onPeerFailure = [this](MemberId, ecclResult_t, const std::string& why, uint64_t, FailureEvidence) { failure = why; };
    b->onPeerFailure = [](MemberId, ecclResult_t, const std::string&, uint64_t, FailureEvidence) {};
    a->addPeer(1, b->address(), "rank 1");
    b->addPeer(0, a->address(), "rank 0");
    a->setEpoch(1);
    b->setEpoch(1);
  }
};

// Every test of the device's behaviour runs over each back end of the
// build; ib's needs an RDMA device, which it has inside scripts/rdma-vm.sh
// (ctest's device_over_soft_roce runs them there).
class DeviceOverEachBackEnd : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "ib" && !std::getenv("ECCL_RDMA_VM_DEV"))
      GTEST_SKIP() << "no RDMA device here: run under scripts/rdma-vm.sh";
  }
};
std::vector<std::string> backendNames() {
  std::vector<std::string> names;
  for (const BackendSpec& b : registeredBackends()) names.push_back(b.name);
  return names;
}
INSTANTIATE_TEST_SUITE_P(Transport, DeviceOverEachBackEnd, ::testing::ValuesIn(backendNames()),
                         [](const auto& info) { return info.param; });

// A refused op's messages are never asked for here: what came before the
// refusal is dropped with it, what comes after is read and dropped, and
// nothing of it is kept in the inbox.
TEST_P(DeviceOverEachBackEnd, MessagesOfARefusedOpAreDroppedNotKept) {
  Pair p(2, GetParam());
  std::vector<uint8_t> early(1 << 20, 1), late(3 << 20, 2);
  auto waitUntil = [](const std::function<bool()>& done) {
    for (int i = 0; i < 1000 && !done(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return done();
  };
  char c = 'x', one = 0;  // the lanes up, and driven once by their receiver
  auto r0 = p.a->irecv(1, 7, 0, &one, 1);
  p.b->wait(p.b->isend(0, 7, 0, &c, 1), deadlineAfterMs(5000 * timeScale()), "send");
  p.a->wait(r0, deadlineAfterMs(5000 * timeScale()), "recv");
  const uint64_t before = p.a->stats().bytesReceived;
  auto s = p.b->isend(0, 1, 0, early.data(), early.size());
  p.b->wait(s, deadlineAfterMs(10000), "send");
  size_t bytes = 0;
  uint64_t order = 0;
  ASSERT_TRUE(waitUntil([&] { return p.a->arrived(1, 1, 0, &bytes, &order); })) << "op 1's message never arrived";
  // Over RDMA the sender's write completes before the receiver reads that
  // it landed: the whole message is in first (a box whose chunks may still
  // land is not dropped; it goes with its peer or its view).
  ASSERT_TRUE(waitUntil([&] { return p.a->stats().bytesReceived >= before + early.size(); }));
  EXPECT_GE(p.a->stats().unexpectedBytesHeld, early.size());
  p.a->refuseCall(1, "rank 0 refused its part of collective op 1 (epoch 1): a test");
  EXPECT_FALSE(p.a->arrived(1, 1, 0, &bytes, &order));
  EXPECT_EQ(p.a->stats().unexpectedBytesHeld, 0u);
  EXPECT_GT(p.a->stats().refusedBytesDropped, 0u);
  // Op 2: refused here first; the peer may post its part before the word
  // reaches it (then it is sent, in part or whole, and dropped on arrival)
  // or after (then its post fails with the refusal).
  p.a->refuseCall(2, "rank 0 refused its part of collective op 2 (epoch 1): a test");
  auto s2 = p.b->isend(0, 2, 0, late.data(), late.size());
  try {
    p.b->wait(s2, deadlineAfterMs(10000), "send");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("refused its part of collective op 2"), std::string::npos) << e.what();
  }
  // The lanes are whole: the next op's message lands.
  std::vector<uint8_t> next(4096, 3), got(4096);
  auto r3 = p.a->irecv(1, 3, 0, got.data(), got.size());
  p.b->wait(p.b->isend(0, 3, 0, next.data(), next.size()), deadlineAfterMs(10000), "send");
  p.a->wait(r3, deadlineAfterMs(10000), "recv");
  EXPECT_EQ(got, next);
  EXPECT_FALSE(p.a->arrived(1, 2, 0, &bytes, &order));
  EXPECT_EQ(p.a->stats().unexpectedBytesHeld, 0u);
}

TEST_P(DeviceOverEachBackEnd, StripedMessageArrivesIntactInBothOrders) {
  Pair p(3, GetParam());
  std::vector<uint8_t> big(5 << 20), got(big.size());
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 131 + 7);
  // Receive posted first.
  auto r = p.b->irecv(0, 1, 0, got.data(), got.size());
  auto s = p.a->isend(1, 1, 0, big.data(), big.size());
  p.a->wait(s, deadlineAfterMs(10000), "send");
  p.b->wait(r, deadlineAfterMs(10000), "recv");
  EXPECT_EQ(got, big);
  EXPECT_EQ(p.a->stats().openByBackEnd, (std::map<std::string, uint64_t>{{GetParam(), 3}}));
  EXPECT_EQ(p.a->stats().openConnections, 3u);
  // Over verbs, three queue pairs and one completion queue serving them.
  EXPECT_EQ(p.a->stats().queuePairsCreated - p.a->stats().queuePairsDestroyed, GetParam() == "ib" ? 3u : 0u);
  EXPECT_EQ(p.a->stats().completionQueuesOpen, GetParam() == "ib" ? 1u : 0u);
  // Send first: the receiver stages it, then copies on the late post.
  std::fill(got.begin(), got.end(), 0);
  s = p.a->isend(1, 2, 0, big.data(), big.size());
  p.a->wait(s, deadlineAfterMs(10000), "send");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  r = p.b->irecv(0, 2, 0, got.data(), got.size());
  p.b->wait(r, deadlineAfterMs(10000), "recv");
  EXPECT_EQ(got, big);
  EXPECT_GE(p.a->stats().connectionsOpened, 3u);
}

// A bulk send (snapshot replication) goes out only while nothing else
// waits on its lane: a small message posted while most of 32 MiB of bulk
// has yet to be written arrives while the bulk has not, and the bulk still
// arrives whole. A try where more than half the bulk was written before the
// small message got posted (the test's thread preempted, or kept off the
// device's lock, on a busy machine) proves nothing either way: the rest
// may land before this thread looks. It is tried again.
TEST_P(DeviceOverEachBackEnd, BulkSendsYieldToMessagesPostedAfterThem) {
  Pair p(1, GetParam());
  std::vector<uint8_t> bulk(32 << 20), got(bulk.size());
  for (size_t i = 0; i < bulk.size(); ++i) bulk[i] = static_cast<uint8_t>(i * 37 + 1);
  // A try proves the order only when this thread saw the small receive
  // done while the bulk one was still pending, or while it knew the bulk
  // could not have gone first. Under load this thread may not run until
  // both are done: such a try says nothing, and another is made.
  int conclusive = 0;
  for (uint32_t attempt = 0; attempt < 10 && conclusive == 0; ++attempt) {
    uint64_t small = 0x5eed + attempt, gotSmall = 0;
    std::fill(got.begin(), got.end(), 0);
    const uint32_t bulkTag = 2 * attempt + 1, smallTag = 2 * attempt + 2;
    auto rb = p.b->irecv(0, bulkTag, 0, got.data(), got.size());
    auto rs = p.b->irecv(0, smallTag, 0, &gotSmall, sizeof(gotSmall));
    const uint64_t sentBefore = p.a->stats().bytesSent;
    auto sb = p.a->isendBulk(1, bulkTag, 0, bulk.data(), bulk.size());
    auto ss = p.a->isend(1, smallTag, 0, &small, sizeof(small));
    // An upper bound on the bulk bytes ahead of the small message.
    const uint64_t bulkAhead = p.a->stats().bytesSent - sentBefore;
    // Watched without the device's lock, which its progress thread holds
    // while it reads on into the bulk.
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (rs->state.load() == Request::kPending && rb->state.load() == Request::kPending && Clock::now() < deadline)
      std::this_thread::yield();
    // Read small, bulk, small: small done before bulk seen pending proves
    // the small one first; bulk seen done before small seen pending proves
    // the bulk first.
    const int smallState = rs->state.load();
    const int bulkState = rb->state.load();
    const int smallAfter = rs->state.load();
    p.b->wait(rs, deadlineAfterMs(10000), "small recv");
    EXPECT_EQ(gotSmall, small);
    if (bulkAhead <= bulk.size() / 2) {
      if (smallState != Request::kPending && bulkState == Request::kPending) {
        conclusive++;
      } else if (bulkState != Request::kPending && smallAfter == Request::kPending) {
        ADD_FAILURE() << "the bulk message went first (" << bulkAhead
                      << " bytes were written before the small one was posted)";
        conclusive++;
      }
    }
    p.a->wait(ss, deadlineAfterMs(10000), "small send");
    p.b->wait(rb, deadlineAfterMs(20000), "bulk recv");
    p.a->wait(sb, deadlineAfterMs(20000), "bulk send");
    EXPECT_EQ(got, bulk);
  }
  EXPECT_EQ(conclusive, 1) << "in ten tries, more than half the bulk was always written before the small message, "
                              "or this thread never saw one of the two receives end before the other";
}

// waitAny returns when one of its requests completes or when woken, and
// never declares the peer failed at its deadline.
TEST_P(DeviceOverEachBackEnd, WaitAnyWakesOnCompletionOrNoticeAndJudgesNobody) {
  Pair p(1, GetParam());
  uint64_t value = 7, got = 0;
  auto r = p.b->irecv(0, 1, 0, &got, sizeof(got));
  auto start = Clock::now();
  p.b->waitAny({r}, Clock::now() + std::chrono::milliseconds(300));
  EXPECT_EQ(r->state.load(), Request::kPending);
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(250));
  std::thread waker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    p.b->notifyWaiters();
  });
  start = Clock::now();
  p.b->waitAny({r}, Clock::now() + std::chrono::seconds(10));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  waker.join();
  auto s = p.a->isend(1, 1, 0, &value, sizeof(value));
  const auto until = Clock::now() + std::chrono::seconds(10);
  while (r->state.load() == Request::kPending && Clock::now() < until) p.b->waitAny({r}, until);
  EXPECT_EQ(r->state.load(), Request::kDone);
  EXPECT_EQ(got, value);
  // The quiet waits judged nobody: the exchange after them went through.
  p.a->wait(s, deadlineAfterMs(10000), "send");
}

// Over RDMA, chunks of ECCL_IB_ZERO_COPY_BYTES and more go by rendezvous
// straight between the two buffers (or into staging when the receive is
// posted late); a message the receive refuses lets its sender go; smaller
// ones and the other back ends use the lanes.
// Over RDMA and over shared memory (process_vm_writev, allowed here: same
// user, one process).
TEST_P(DeviceOverEachBackEnd, LargeChunksMoveZeroCopyOverRdmaAndSharedMemory) {
  Pair p(2, GetParam());
  const bool rdma = GetParam() != "tcp";
  std::vector<uint8_t> big(3 << 20), got(big.size());
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 29 + 3);
  uint32_t crc = crc32c(big.data(), big.size());
  for (uint64_t seq : {1, 2}) {  // posted first, then late
    std::fill(got.begin(), got.end(), 0);
    transport::RequestPtr r;
    if (seq == 1) r = p.b->irecv(0, seq, 0, got.data(), got.size());
    auto s = p.a->isend(1, seq, 0, big.data(), big.size(), &crc);
    if (seq == 2) std::this_thread::sleep_for(std::chrono::milliseconds(50)), r = p.b->irecv(0, seq, 0, got.data(), got.size());
    p.a->wait(s, deadlineAfterMs(20000), "send");
    p.b->wait(r, deadlineAfterMs(20000), "recv");
    EXPECT_EQ(got, big) << "seq " << seq;
  }
  // Two lanes, stripes of 1.5 MiB each, both messages.
  EXPECT_EQ(p.a->stats().zeroCopyChunksSent, rdma ? 4u : 0u);
  EXPECT_EQ(p.b->stats().zeroCopyChunksReceived, rdma ? 4u : 0u);
  if (GetParam() == "shm") {
    EXPECT_EQ(p.a->stats().singleCopyLanes, 2u);  // its ends of both lanes
    EXPECT_EQ(p.a->stats().singleCopyRefused, 0u);
    EXPECT_EQ(p.a->stats().singleCopyBytes, 2 * big.size());
    // process_vm_writev copies in the call: with the device lock released.
    EXPECT_EQ(p.a->stats().zeroCopyBytesUnlocked, 2 * big.size());
  } else {
    EXPECT_EQ(p.a->stats().zeroCopyBytesUnlocked, 0u);  // a verbs write is a post, done under the lock
  }
  // Small messages keep using the ring.
  int32_t v = 7, w = 0;
  auto r = p.b->irecv(0, 3, 0, &w, 4);
  p.a->wait(p.a->isend(1, 3, 0, &v, 4), deadlineAfterMs(5000 * timeScale()), "send");
  p.b->wait(r, deadlineAfterMs(5000 * timeScale()), "recv");
  EXPECT_EQ(w, 7);
  EXPECT_EQ(p.a->stats().zeroCopyChunksSent, rdma ? 4u : 0u);
  // A receive of the wrong size refuses the message: it fails, the sender
  // is let go, nothing is written into it, the link stays.
  std::vector<uint8_t> half(big.size() / 2, 0xEE);
  r = p.b->irecv(0, 4, 0, half.data(), half.size());
  auto s = p.a->isend(1, 4, 0, big.data(), big.size());
  p.a->wait(s, deadlineAfterMs(20000), "send");
  expectRefusedUntouched(*p.b, r, half);
  r = p.b->irecv(0, 5, 0, got.data(), got.size());
  p.a->wait(p.a->isend(1, 5, 0, big.data(), big.size()), deadlineAfterMs(20000), "send");
  p.b->wait(r, deadlineAfterMs(20000), "recv");
  EXPECT_EQ(got, big);
}

// Many rendezvous both ways at once, as a ring allreduce makes them: each
// side clears several of the other's chunks while its own are cleared, so
// writes wait their turn (one started per pass, the other side's
// clear-to-sends answered between them). One side's caller drives its
// device; the other only waits (waitAny), so its progress thread alone
// must come back to the writes it held back. Every message lands whole.
TEST_P(DeviceOverEachBackEnd, ManyRendezvousBothWaysAllLand) {
  Pair p(1, GetParam());
  constexpr int kMessages = 12;
  constexpr size_t kBytes = 256 << 10;
  auto pattern = [](int side, int m, size_t i) { return static_cast<uint8_t>(i * 13 + m * 7 + side * 101); };
  std::vector<std::vector<uint8_t>> out[2], in[2];
  std::vector<RequestPtr> requests[2];
  Device* devices[2] = {p.a.get(), p.b.get()};
  for (int side = 0; side < 2; ++side)
    for (int m = 0; m < kMessages; ++m) {
      out[side].emplace_back(kBytes);
      in[side].emplace_back(kBytes, 0);
      for (size_t i = 0; i < kBytes; ++i) out[side][m][i] = pattern(side, m, i);
    }
  // Half the receives before the sends, half after (staged, then cleared).
  for (int side = 0; side < 2; ++side)
    for (int m = 0; m < kMessages / 2; ++m)
      requests[side].push_back(devices[side]->irecv(1 - side, 100 + m, 0, in[side][m].data(), kBytes));
  for (int m = 0; m < kMessages; ++m)
    for (int side = 0; side < 2; ++side)
      requests[side].push_back(devices[side]->isend(1 - side, 100 + m, 0, out[side][m].data(), kBytes));
  for (int side = 0; side < 2; ++side)
    for (int m = kMessages / 2; m < kMessages; ++m)
      requests[side].push_back(devices[side]->irecv(1 - side, 100 + m, 0, in[side][m].data(), kBytes));
  std::thread waiter([&] {
    const Deadline until = deadlineAfterMs(30000);
    for (const RequestPtr& r : requests[1])
      while (r->state.load() == Request::kPending && Clock::now() < until) p.b->waitAny({r}, until);
  });
  for (const RequestPtr& r : requests[0]) p.a->wait(r, deadlineAfterMs(30000), "transfer");
  waiter.join();
  for (const RequestPtr& r : requests[1]) EXPECT_EQ(r->state.load(), Request::kDone) << r->error;
  for (int side = 0; side < 2; ++side)
    for (int m = 0; m < kMessages; ++m) {
      bool whole = true;
      for (size_t i = 0; i < kBytes && whole; ++i) whole = in[side][m][i] == pattern(1 - side, m, i);
      EXPECT_TRUE(whole) << "message " << m << " to side " << side;
    }
  const uint64_t zeroCopy = GetParam() != "tcp" ? kMessages : 0;
  EXPECT_EQ(p.a->stats().zeroCopyChunksSent, zeroCopy);
  EXPECT_EQ(p.b->stats().zeroCopyChunksSent, zeroCopy);
}

// A collective's receive posted before its message is announced to the
// sender over RDMA or shared memory, which then writes its large chunks
// there without asking (no clear-to-send). An announced receive of the wrong size gets
// none of the message; one withdrawn (a new view) fails only once the
// sender has let it go, and the link stays. Over the other back ends
// nothing is announced and the same transfers go on the lanes.
TEST_P(DeviceOverEachBackEnd, AnnouncedReceivesAreWrittenWithoutAsking) {
  Pair p(2, GetParam());
  const bool rdma = GetParam() != "tcp";
  auto heard = [&](uint64_t count) {
    const auto until = Clock::now() + std::chrono::seconds(10);
    while (rdma && p.a->stats().announcementsHeard < count && Clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(p.a->stats().announcementsHeard, rdma ? count : 0u);
  };
  uint64_t hello = 1, helloBack = 0;  // connects the lanes: only a receive from a connected peer is announced
  auto r = p.b->irecv(0, 9, 0, &helloBack, sizeof(helloBack));
  p.a->wait(p.a->isend(1, 9, 0, &hello, sizeof(hello)), deadlineAfterMs(20000), "send");
  p.b->wait(r, deadlineAfterMs(20000), "recv");
  // The hello may come on lane 0 before the receiver installed lane 1.
  for (const Deadline until = deadlineAfterMs(10000); p.b->stats().openConnections < 2 && Clock::now() < until;)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::vector<uint8_t> big(3 << 20), got(big.size());
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 53 + 11);
  const uint32_t crc = crc32c(big.data(), big.size());
  r = p.b->irecv(0, 1, 0, got.data(), got.size());
  heard(1);
  p.a->wait(p.a->isend(1, 1, 0, big.data(), big.size(), &crc), deadlineAfterMs(20000), "send");
  p.b->wait(r, deadlineAfterMs(20000), "recv");
  EXPECT_EQ(got, big);
  EXPECT_EQ(p.a->stats().zeroCopyChunksPrewritten, rdma ? 2u : 0u);  // both stripes
  EXPECT_EQ(p.b->stats().zeroCopyChunksReceived, rdma ? 2u : 0u);
  EXPECT_EQ(p.b->stats().receivesAnnounced, rdma ? 1u : 0u);

  // The wrong size: the sender offers instead, the receive refuses.
  std::vector<uint8_t> half(big.size() / 2, 0xEE);
  r = p.b->irecv(0, 2, 0, half.data(), half.size());
  heard(2);
  p.a->wait(p.a->isend(1, 2, 0, big.data(), big.size()), deadlineAfterMs(20000), "send");
  expectRefusedUntouched(*p.b, r, half);
  EXPECT_EQ(p.a->stats().zeroCopyChunksPrewritten, rdma ? 2u : 0u);

  // Withdrawn by a new view before anything was sent: it fails, and not
  // before the sender released it (a deadline would say it hung).
  r = p.b->irecv(0, 3, 0, got.data(), got.size());
  heard(3);
  p.b->beginEpoch(2);
  try {
    p.b->wait(r, deadlineAfterMs(20000), "recv");
    ADD_FAILURE() << "a receive of a superseded view completed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("superseded"), std::string::npos) << e.what();
  }
  p.a->beginEpoch(2);
  std::fill(got.begin(), got.end(), 0);
  r = p.b->irecv(0, 4, 0, got.data(), got.size());
  heard(4);
  p.a->wait(p.a->isend(1, 4, 0, big.data(), big.size(), &crc), deadlineAfterMs(20000), "send");
  p.b->wait(r, deadlineAfterMs(20000), "recv");
  EXPECT_EQ(got, big);
  EXPECT_EQ(p.a->stats().zeroCopyChunksPrewritten, rdma ? 4u : 0u);
  EXPECT_TRUE(p.a->hasPeer(1) && p.b->hasPeer(0)) << "the link did not stay";
}

// ECCL_IB_REGISTRATION_CACHE_BYTES keeps zero-copy registrations: a buffer
// sent from (and one received into) again is found registered.
TEST_P(DeviceOverEachBackEnd, KeptRegistrationsAreReusedWhenAsked) {
  setenv("ECCL_IB_REGISTRATION_CACHE_BYTES", "67108864", 1);
  Pair p(1, GetParam());
  unsetenv("ECCL_IB_REGISTRATION_CACHE_BYTES");
  std::vector<uint8_t> big(1 << 20), got(big.size());
  for (int round = 0; round < 3; ++round) {
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 7 + round);
    auto r = p.b->irecv(0, round + 1, 0, got.data(), got.size());
    p.a->wait(p.a->isend(1, round + 1, 0, big.data(), big.size()), deadlineAfterMs(20000), "send");
    p.b->wait(r, deadlineAfterMs(20000), "recv");
    ASSERT_EQ(got, big) << "round " << round;
  }
  const bool rdma = GetParam() == "ib";
  EXPECT_EQ(p.a->stats().registrationsReused, rdma ? 2u : 0u);  // the source, in rounds 2 and 3
  // The destination, in rounds 2 and 3; a chunk offered before the
  // receive's announcement reached the sender is exposed again (a hit too).
  if (rdma) EXPECT_GE(p.b->stats().registrationsReused, 2u);
  if (!rdma) EXPECT_EQ(p.b->stats().registrationsReused, 0u);
}

TEST_P(DeviceOverEachBackEnd, ChecksummedMessagesAreVerifiedByTheReceiver) {
  Pair p(2, GetParam());
  std::vector<uint8_t> msg(100000), got(msg.size());
  for (size_t i = 0; i < msg.size(); ++i) msg[i] = static_cast<uint8_t>(i * 7);
  uint32_t good = crc32c(msg.data(), msg.size()), bad = good ^ 1;
  auto r = p.b->irecv(0, 1, 0, got.data(), got.size());
  p.a->wait(p.a->isend(1, 1, 0, msg.data(), msg.size(), &good), deadlineAfterMs(5000 * timeScale()), "send");
  p.b->wait(r, deadlineAfterMs(5000 * timeScale()), "recv");
  EXPECT_EQ(got, msg);
  // A wrong checksum (a corrupted record) fails that receive only, posted
  // before or after the data arrived.
  for (uint64_t seq : {2, 3}) {
    transport::RequestPtr late;
    if (seq == 2) late = p.b->irecv(0, seq, 0, got.data(), got.size());
    p.a->wait(p.a->isend(1, seq, 0, msg.data(), msg.size(), &bad), deadlineAfterMs(5000), "send");
    if (seq == 3) std::this_thread::sleep_for(std::chrono::milliseconds(50)), late = p.b->irecv(0, seq, 0, got.data(), got.size());
    try {
      p.b->wait(late, deadlineAfterMs(5000), "recv");
      ADD_FAILURE() << "a corrupted message was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("failed its checksum"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
    }
  }
  int32_t v = 5, w = 0;
  auto r2 = p.b->irecv(0, 4, 0, &w, 4);
  p.a->wait(p.a->isend(1, 4, 0, &v, 4), deadlineAfterMs(5000), "send");
  p.b->wait(r2, deadlineAfterMs(5000), "recv");  // the connection is still good
  EXPECT_EQ(w, 5);
}

// Waits until `bytes` more payload than `before` has been read by `d`.
bool awaitReceived(Device& d, uint64_t before, uint64_t bytes) {
  const auto until = Clock::now() + std::chrono::seconds(10 * timeScale());
  while (d.stats().bytesReceived < before + bytes && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return d.stats().bytesReceived >= before + bytes;
}

// A message that came whole before its receive is copied out of staging
// with the device lock released (stagedBytesCopiedUnlocked) and intact; one
// that fails its checksum leaves the caller's buffer as it was.
TEST_P(DeviceOverEachBackEnd, AWholeEarlyMessageIsCopiedOutWithoutTheLock) {
  Pair p(2, GetParam());
  std::vector<uint8_t> msg(1 << 20);
  for (size_t i = 0; i < msg.size(); ++i) msg[i] = static_cast<uint8_t>(i * 13 + (i >> 12));
  uint32_t good = crc32c(msg.data(), msg.size()), bad = good ^ 1;
  for (uint64_t seq : {1, 2}) {
    const uint64_t before = p.b->stats().bytesReceived;
    const uint64_t copiedBefore = p.b->stats().stagedBytesCopiedUnlocked;
    p.a->wait(p.a->isend(1, seq, 0, msg.data(), msg.size(), seq == 1 ? &good : &bad),
              deadlineAfterMs(10000 * timeScale()), "send");
    ASSERT_TRUE(awaitReceived(*p.b, before, msg.size())) << "the message never arrived whole";
    size_t bytes = 0;
    uint64_t order = 0;
    ASSERT_TRUE(p.b->arrived(0, seq, 0, &bytes, &order));
    EXPECT_EQ(bytes, msg.size());
    std::vector<uint8_t> got(msg.size(), 0xee);
    auto r = p.b->irecv(0, seq, 0, got.data(), got.size());
    if (seq == 1) {
      p.b->wait(r, deadlineAfterMs(5000), "recv");
      EXPECT_EQ(got, msg);
      EXPECT_EQ(p.b->stats().stagedBytesCopiedUnlocked - copiedBefore, msg.size());
    } else {
      EXPECT_THROW(p.b->wait(r, deadlineAfterMs(5000), "recv"), Error);
      EXPECT_EQ(got, std::vector<uint8_t>(msg.size(), 0xee)) << "a corrupted message was copied into the buffer";
      EXPECT_EQ(p.b->stats().stagedBytesCopiedUnlocked - copiedBefore, msg.size()) << "checked without the lock";
    }
  }
  EXPECT_EQ(p.b->stats().unexpectedBytesHeld, 0u);
}

TEST_P(DeviceOverEachBackEnd, SizeMismatchIsAUsageErrorAndKeepsTheConnection) {
  Pair p(2, GetParam());
  int32_t four[4] = {1, 2, 3, 4}, two[2];
  auto r = p.b->irecv(0, 1, 0, two, sizeof(two));
  p.a->isend(1, 1, 0, four, sizeof(four));
  try {
    p.b->wait(r, deadlineAfterMs(5000), "recv");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ecclInvalidUsage);
    EXPECT_NE(std::string(e.what()).find("16 bytes where 8"), std::string::npos) << e.what();
  }
  // The link still works.
  r = p.b->irecv(0, 2, 0, two, sizeof(two));
  p.a->isend(1, 2, 0, four, sizeof(two));
  p.b->wait(r, deadlineAfterMs(5000), "recv");
  EXPECT_EQ(two[1], 2);
}

TEST_P(DeviceOverEachBackEnd, TimeoutNamesThePeerAndFailsLaterOps) {
  Pair p(2, GetParam());
  char c;
  auto r = p.b->irecv(0, 9, 0, &c, 1);
  auto start = Clock::now();
  try {
    p.b->wait(r, deadlineAfterMs(300), "allreduce (op 9)");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ecclTimeout);
    EXPECT_NE(std::string(e.what()).find("allreduce (op 9): peer rank 0"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
}

// A caller waiting on a message reads its peer's sockets itself; a failure
// decided on another thread (here the coordinator's notice) must still wake
// it at once, not when its poll slice ends.
TEST_P(DeviceOverEachBackEnd, DrivingWaiterWakesWhenAnotherThreadFailsThePeer) {
  Pair p(2, GetParam());
  char c = 'x', got = 0;
  auto r0 = p.b->irecv(0, 1, 0, &got, 1);
  p.a->wait(p.a->isend(1, 1, 0, &c, 1), deadlineAfterMs(5000 * timeScale()), "send");
  p.b->wait(r0, deadlineAfterMs(5000 * timeScale()), "recv");
  ASSERT_EQ(got, 'x');
  auto r = p.b->irecv(0, 2, 0, &got, 1);
  Clock::time_point failedAt;
  std::thread notifier([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    failedAt = Clock::now();
    p.b->failPeer(0, ecclRemoteError, "the coordinator declared rank 0 failed");
  });
  try {
    p.b->wait(r, deadlineAfterMs(20000), "recv");
    ADD_FAILURE() << "the wait returned without the failure";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the coordinator declared rank 0 failed"), std::string::npos) << e.what();
  }
  auto woke = Clock::now();
  notifier.join();
  EXPECT_LT(woke - failedAt, std::chrono::milliseconds(500));
}

// A sender whose last send completed and which then died leaves that
// send's last bytes in the lanes (or, after a write into our memory, the
// frame saying it landed), and the coordinator's verdict can come while
// this side still copies them, maybe on another thread with the lock
// released: what was sent before the death arrives whole, and only later
// receives fail. Repeated: the verdict falls at another point of the copy.
// Sizes: a message through the lanes' rings (under Pair's shared-memory
// single-copy bound) and one written into our memory.
TEST_P(DeviceOverEachBackEnd, AVerdictRightAfterTheLastSendLetsItsBytesArrive) {
  const bool slow = GetParam() == "ib";  // Soft-RoCE under an emulated CPU
  for (int round = 0; round < (slow ? 2 : 12); ++round) {
    std::vector<uint8_t> sent(round % 2 ? (slow ? 1 << 20 : 8 << 20) : 48 << 10), into(sent.size());
    for (size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<uint8_t>(i * 7 + (i >> 12) + round);
    const int64_t ms = (slow ? 60000 : 10000) * timeScale();
    Pair p(2, GetParam());
    std::vector<uint8_t> first(16 << 10, 1), firstIn(first.size());  // through a ring, not the fast path's slots
    char late = 0;
    auto warm = p.b->irecv(0, 1, 0, firstIn.data(), firstIn.size());
    auto r = p.b->irecv(0, 2, 0, into.data(), into.size());
    auto after = p.b->irecv(0, 3, 0, &late, 1);
    // The receiver's own thread drives its lanes meanwhile, copying with the
    // lock released, as a caller's wait does.
    std::string received;
    std::atomic<bool> warmed{false};
    std::thread receiver([&] {
      try {
        p.b->wait(warm, deadlineAfterMs(ms), "first recv");
        warmed = true;
        p.b->wait(r, deadlineAfterMs(ms), "recv");
      } catch (const Error& e) {
        received = e.what();
      }
    });
    // The receiver went to sleep on its lanes before the first one opened:
    // the new lanes' first frames must wake it (they once waited out its
    // one-second poll).
    const auto sending = Clock::now();
    p.a->wait(p.a->isend(1, 1, 0, first.data(), first.size()), deadlineAfterMs(ms), "first send");
    while ((!warmed || p.b->lanesUp(0) < 2) && Clock::now() - sending < std::chrono::milliseconds(ms))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_LT(Clock::now() - sending, std::chrono::milliseconds(500 * timeScale())) << "round " << round;
    // Both ends' lanes are up (a verdict before the receiver accepted a
    // lane would find nothing to read there: not this test's race).
    p.a->wait(p.a->isend(1, 2, 0, sent.data(), sent.size()), deadlineAfterMs(ms), "send");
    p.b->failPeer(0, ecclRemoteError, "the coordinator: rank 0 died");
    receiver.join();
    EXPECT_EQ(received, "") << "round " << round;
    EXPECT_TRUE(into == sent) << "round " << round << ": the message arrived changed";
    try {
      p.b->wait(after, deadlineAfterMs(ms), "recv");
      ADD_FAILURE() << "round " << round << ": a receive nothing was sent for completed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("rank 0 died"), std::string::npos) << e.what();
    }
    p.b.reset();  // first: the side that gave the other up closes its lanes at once
  }
}

// After a wait the lanes stay with callers for a short lease; a member that
// then sits idle must get them back onto its progress thread, or a peer's
// large send (more than the socket buffers hold) would stall until the idle
// member waits again.
TEST_P(DeviceOverEachBackEnd, IdleMemberKeepsReceivingAfterItsOwnWait) {
  Pair p(1, GetParam());
  char c = 'x', got = 0;
  auto r0 = p.b->irecv(0, 1, 0, &got, 1);
  p.a->wait(p.a->isend(1, 1, 0, &c, 1), deadlineAfterMs(5000 * timeScale()), "send");
  p.b->wait(r0, deadlineAfterMs(5000 * timeScale()), "recv");  // b drove its lanes just now
  std::vector<uint8_t> big(64 << 20), into(big.size());
  for (size_t i = 0; i < big.size(); i += 4096) big[i] = static_cast<uint8_t>(i >> 12);
  // Soft-RoCE under the VM's emulated CPU moves a few MB/s: 64 MiB gets
  // a minute there, 5 s elsewhere.
  const int64_t ms = GetParam() == "ib" ? 60000 : 5000;
  p.a->wait(p.a->isend(1, 2, 0, big.data(), big.size()), deadlineAfterMs(ms), "send while the receiver is idle");
  auto r = p.b->irecv(0, 2, 0, into.data(), into.size());
  p.b->wait(r, deadlineAfterMs(ms), "recv");
  EXPECT_EQ(into, big);
}

// A client that knows the secret but speaks garbage after the handshake.
class Intruder {
 public:
  Intruder(Device& target, MemberId claim, uint64_t jobId = 5) {
    fd_ = connectTo(tcpAddress(target), deadlineAfterMs(2000), "intruder");
    Secret s;
    s.fill(1);
    membership::authenticateAsClient(fd_.get(), s, {membership::Purpose::kData, jobId, claim, target.self(), 0},
                                    deadlineAfterMs(2000), "intruder");
  }
  void sendRaw(const void* p, size_t n) { sendAll(fd_.get(), p, n, deadlineAfterMs(2000), "intruder"); }
  void sendFrame(const FrameHeader& h, const void* payload) {
    uint8_t buf[FrameHeader::kSize];
    encodeFrame(h, buf);
    sendRaw(buf, sizeof(buf));
    if (h.length) sendRaw(payload, h.length);
  }
  Fd fd_;
};

FrameHeader dataFrame(uint32_t epoch, uint64_t seq, uint32_t len) {
  FrameHeader h;
  h.epoch = epoch;
  h.commId = 5;
  h.seq = seq;
  h.length = len;
  h.total = len;
  return h;
}

// Member 3 of job 5, one lane, on loopback: the target of the intruder tests.
std::unique_ptr<Device> memberThreeDevice() {
  DeviceOptions o = loopbackOptions("tcp", 5, 1, 3);
  return createDevice(o);
}

// Where peers come from connections, posting never waits for a connection:
// a peer whose listener accepts and then says nothing holds only its own
// dial, and the other peers' lanes come up meanwhile.
TEST(TcpDevice, ASilentPeerDelaysNoPostAndNoOtherDial) {
  auto [silentListener, silentAddress] = listenOn(SockAddr::parse("127.0.0.1:0"));
  DeviceOptions o = loopbackOptions("tcp", 5, 1);
  o.handshakeTimeoutMs = 4000;
  o.peersFromConnections = true;
  o.acceptSecrets = membership::singleJob(o.secret, o.jobId);
  auto a = createDevice(o);
  o.self = 2;
  auto b = createDevice(o);
  a->onPeerFailure = [](MemberId, ecclResult_t, const std::string&, uint64_t, FailureEvidence) {};
  b->onPeerFailure = [](MemberId, ecclResult_t, const std::string&, uint64_t, FailureEvidence) {};
  a->addPeer(1, "tcp:" + silentAddress.str(), "rank 1 (silent)", Device::PeerRole::kCandidate);
  a->addPeer(2, b->address(), "rank 2", Device::PeerRole::kCandidate);
  a->setEpoch(1);
  b->setEpoch(1);
  int32_t x = 7, y = 0;
  auto stuck = a->isend(1, 1, 0, &x, 4);  // starts the silent dial first
  EXPECT_EQ(stuck->state.load(), Request::kPending);
  auto s = a->isend(2, 1, 0, &x, 4);
  // Well inside the silent peer's handshake deadline: a dial behind it
  // would still be waiting.
  a->wait(s, deadlineAfterMs(2500), "send");
  for (int i = 0; i < 250 && !b->hasPeer(Device::inboundPeer(0)); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // its lanes are in
  auto r = b->irecv(Device::inboundPeer(0), 1, 0, &y, 4);
  b->wait(r, deadlineAfterMs(2500), "recv");
  EXPECT_EQ(y, 7);
  EXPECT_EQ(stuck->state.load(), Request::kPending);
  try {
    a->wait(stuck, deadlineAfterMs(10000), "send");
    FAIL() << "a send to a silent peer completed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 (silent)"), std::string::npos) << e.what();
  }
}

using FailureHook = decltype(Device::onPeerFailure);

// Members 0-2 over TCP at epoch 1, each connected to the others; member m's
// onPeerFailure is hookFor(m).
std::vector<std::unique_ptr<Device>> connectedTrio(const std::function<FailureHook(MemberId)>& hookFor) {
  DeviceOptions o = loopbackOptions("tcp", 5, 1);
  std::vector<std::unique_ptr<Device>> d;
  for (MemberId m = 0; m < 3; ++m) {
    o.self = m;
    d.push_back(createDevice(o));
    d.back()->onPeerFailure = hookFor(m);
  }
  for (MemberId m = 0; m < 3; ++m) {
    for (MemberId q = 0; q < 3; ++q)
      if (q != m) d[m]->addPeer(q, d[q]->address(), "rank " + std::to_string(q));
    d[m]->setEpoch(1);
  }
  connectAll(*d[0], {1, 2}, deadlineAfterMs(5000));
  connectAll(*d[1], {0, 2}, deadlineAfterMs(5000));
  connectAll(*d[2], {0, 1}, deadlineAfterMs(5000));
  return d;
}

// A member that finished collective 1 and destroyed its communicator
// breaks the view from the first collective that needs it (2), not before:
// a slower member still finishing collective 1 with the others keeps it.
TEST(TcpDevice, ALeaverNeededByALaterCollectiveSparesTheEarlierOne) {
  auto d = connectedTrio([](MemberId) { return [](MemberId, ecclResult_t, const std::string&, uint64_t, FailureEvidence) {}; });
  int32_t fromLeaver = 0, fromZero = 0, x = 7, late = 0;
  auto r0 = d[0]->irecv(2, 1, 0, &fromLeaver, 4);
  d[2]->wait(d[2]->isend(0, 1, 0, &x, 4), deadlineAfterMs(5000), "send");
  d[0]->wait(r0, deadlineAfterMs(5000), "recv");
  auto slow = d[1]->irecv(0, 1, 0, &fromZero, 4);  // rank 1 is still in collective 1
  d[2]->close(deadlineAfterMs(200));
  d[2].reset();
  // Rank 0 needs the leaver for collective 2.
  auto needs = d[0]->irecv(2, 2, 0, &late, 4);
  EXPECT_THROW(d[0]->wait(needs, deadlineAfterMs(5000), "recv"), Error);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // its revocation reaches rank 1
  d[0]->wait(d[0]->isend(1, 1, 0, &x, 4), deadlineAfterMs(5000), "send");
  d[1]->wait(slow, deadlineAfterMs(5000), "recv");  // collective 1 completes
  EXPECT_EQ(fromZero, 7);
  auto later = d[1]->irecv(0, 2, 0, &late, 4);
  expectFailsForALeaver(*d[1], later, "collective 2 survived the leaver", "rank 2");
}

// A fast member sends its part and destroys its communicator before a slow
// one gets to connecting the view (a 2-rank job under load did this): the
// slow one's connect succeeds, the data is received, and only an op that
// needs more of the leaver fails.
TEST(TcpDevice, APeerThatLeftInOrderBeforeTheConnectIsNoFailureOfTheView) {
  auto d = connectedTrio([](MemberId) { return [](MemberId, ecclResult_t, const std::string&, uint64_t, FailureEvidence) {}; });
  int32_t x = 41, got = 0, late = 0;
  d[2]->wait(d[2]->isend(0, 1, 0, &x, 4), deadlineAfterMs(5000), "send");
  d[2]->close(deadlineAfterMs(200));
  d[2].reset();
  const Deadline until = deadlineAfterMs(5000);
  while (!d[0]->stats().connectionsClosed && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // its goodbye is in
  ASSERT_NE(d[0]->stats().connectionsClosed, 0u);
  EXPECT_NO_THROW(connectAll(*d[0], {1, 2}, deadlineAfterMs(5000)));
  auto r = d[0]->irecv(2, 1, 0, &got, 4);
  d[0]->wait(r, deadlineAfterMs(5000), "recv");
  EXPECT_EQ(got, 41);
  auto more = d[0]->irecv(2, 2, 0, &late, 4);
  expectFailsForALeaver(*d[0], more, "a receive from a member that had left completed");
}

// A member that died right after its switchover vote can be judged failed
// by the coordinator while a joiner still holds it as a candidate: once the
// view names it, connecting fails at once with the verdict (it once waited
// out the whole timeout for a dial from the dead member).
TEST(TcpDevice, AVerdictOnACandidateStandsWhenTheViewNamesIt) {
  DeviceOptions o = loopbackOptions("tcp", 5, 1);
  auto a = createDevice(o);
  o.self = 2;
  auto b = createDevice(o);
  a->onPeerFailure = [](MemberId, ecclResult_t, const std::string&, uint64_t, FailureEvidence) {};
  b->onPeerFailure = [](MemberId, ecclResult_t, const std::string&, uint64_t, FailureEvidence) {};
  a->addPeer(2, b->address(), "rank 2", Device::PeerRole::kCandidate);
  a->failPeer(2, ecclRemoteError, "the coordinator: rank 2 died", 0);
  a->addPeer(2, b->address(), "rank 2", Device::PeerRole::kViewMember);
  const auto start = Clock::now();
  try {
    a->connectNow(2, deadlineAfterMs(10000));
    FAIL() << "connected to a member the coordinator had judged failed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2 died"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
}

// The coordinator (or a peer) says a member that left in order was needed
// from collective 2 on, before the leaver's data for collective 1 reached
// this slower member: its receive of that data still completes, and only
// collectives from 2 on fail.
TEST(TcpDevice, ANoticeOfALeaverNeededLaterSparesAReceiveStillInFlight) {
  std::vector<uint64_t> reportedFrom;  // declared first: outlives the devices' threads
  auto d = connectedTrio([&reportedFrom](MemberId m) -> FailureHook {
    if (m != 1) return [](MemberId, ecclResult_t, const std::string&, uint64_t, FailureEvidence) {};
    return [&reportedFrom](MemberId, ecclResult_t, const std::string&, uint64_t from, FailureEvidence) { reportedFrom.push_back(from); };
  });
  int32_t fromLeaver = 0, x = 7, late = 0;
  auto slow = d[1]->irecv(2, 1, 0, &fromLeaver, 4);
  d[1]->failPeer(2, ecclRemoteError, "rank 2 failed: reported by rank 0: peer rank 2 has left", /*neededFrom=*/2);
  EXPECT_EQ(reportedFrom, std::vector<uint64_t>{2});  // what the communicator tells the coordinator
  d[2]->wait(d[2]->isend(1, 1, 0, &x, 4), deadlineAfterMs(5000), "send");
  d[2]->close(deadlineAfterMs(200));
  d[2].reset();
  d[1]->wait(slow, deadlineAfterMs(5000), "recv");  // collective 1 completes
  EXPECT_EQ(fromLeaver, 7);
  auto later = d[1]->irecv(0, 2, 0, &late, 4);
  expectFailsForALeaver(*d[1], later, "collective 2 survived the leaver");
}

TEST(TcpDevice, StaleEpochFramesAreDroppedAndCounted) {
  auto dev = memberThreeDevice();
  dev->onPeerFailure = [](MemberId, ecclResult_t, const std::string&, uint64_t, FailureEvidence) {};
  dev->addPeer(0, "tcp:127.0.0.1:1", "rank 0");
  dev->setEpoch(4);
  Intruder peer(*dev, 0);
  int32_t v = 0, stale = 111, fresh = 222;
  auto r = dev->irecv(0, 1, 0, &v, 4);
  peer.sendFrame(dataFrame(3, 1, 4), &stale);
  peer.sendFrame(dataFrame(4, 1, 4), &fresh);
  dev->wait(r, deadlineAfterMs(3000), "recv");
  EXPECT_EQ(v, 222);
  EXPECT_EQ(dev->stats().staleFramesDropped, 1u);
}

TEST(TcpDevice, MalformedFrameFailsThatPeerAndRevokesWithItsName) {
  std::string failure;  // declared first: outlives the device's threads
  auto dev = memberThreeDevice();
  dev->onPeerFailure = [&](MemberId, ecclResult_t, const std::string& why, uint64_t, FailureEvidence) { failure = why; };
  dev->addPeer(0, "tcp:127.0.0.1:1", "rank 0");
  dev->addPeer(1, "tcp:127.0.0.1:1", "rank 1");
  dev->setEpoch(1);
  Intruder bad(*dev, 0), good(*dev, 1);
  int32_t v = 0, w = 0, payload = 5;
  auto fromBad = dev->irecv(0, 1, 0, &v, 4);
  auto fromGood = dev->irecv(1, 1, 0, &w, 4);
  uint8_t garbage[FrameHeader::kSize];
  std::memset(garbage, 0x5a, sizeof(garbage));
  bad.sendRaw(garbage, sizeof(garbage));
  try {
    dev->wait(fromBad, deadlineAfterMs(3000), "recv");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ecclRemoteError);
    EXPECT_NE(std::string(e.what()).find("malformed frame"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
  }
  EXPECT_EQ(dev->stats().framesRejected, 1u);
  EXPECT_NE(failure.find("malformed frame"), std::string::npos) << failure;
  // A failed member revokes the communicator: ops on other peers fail fast
  // with the culprit's name instead of waiting for their deadline, and the
  // good peer's late data is never written into the failed receive's buffer.
  good.sendFrame(dataFrame(1, 1, 4), &payload);
  try {
    dev->wait(fromGood, deadlineAfterMs(3000), "recv");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
  }
  EXPECT_EQ(w, 0);
}

// What a hand-driven peer read from the device until it went quiet: the
// data frames' payload bytes per op, whether every bulk frame (op
// `bulkSeq`) asked to be counted and no other did; control frames skipped.
struct Drained {
  std::map<uint64_t, uint64_t> bytesByOp;
  bool flagsRight = true;
};
Drained drainUntilQuiet(Intruder& peer, uint64_t bulkSeq) {
  Drained d;
  std::vector<uint8_t> payload;
  for (;;) {
    pollfd pfd{peer.fd_.get(), POLLIN, 0};
    if (::poll(&pfd, 1, 300) <= 0) return d;
    uint8_t raw[FrameHeader::kSize];
    recvAll(peer.fd_.get(), raw, sizeof(raw), deadlineAfterMs(2000), "intruder");
    std::string why;
    auto h = decodeFrame(raw, &why);
    if (!h) {
      ADD_FAILURE() << "the device sent a malformed frame: " << why;
      return d;
    }
    payload.resize(h->length);
    if (h->length) recvAll(peer.fd_.get(), payload.data(), h->length, deadlineAfterMs(2000), "intruder");
    if (h->type != FrameType::kData) continue;
    d.bytesByOp[h->seq] += h->length;
    d.flagsRight &= ((h->flags & FrameHeader::kBulkCredit) != 0) == (h->seq == bulkSeq);
  }
}

void reportBulkRead(Intruder& peer, uint64_t bytes) {
  FrameHeader h;
  h.type = FrameType::kBulkRead;
  h.epoch = 1;
  h.commId = 5;
  h.length = 8;
  peer.sendFrame(h, &bytes);
}

// Over TCP the device cannot see what its peer has read (the kernel
// buffers 4 MiB or more on each end), so it counts: on a busy lane a bulk
// message to a peer that reports no reads stops after 128 KiB while a
// foreground send posted later still goes; each report lets that much more
// go; a report of more than was sent drops the peer, named.
TEST(TcpDevice, BulkWaitsForThePeersReadReports) {
  std::string failure;  // declared first: outlives the device's threads
  DeviceOptions o = loopbackOptions("tcp", 5, 1, 3);
  o.bulkQuietAfterMs = 600000;  // the lane stays busy: no quiet spell lets bulk fill it
  auto dev = createDevice(o);
  dev->onPeerFailure = [&](MemberId, ecclResult_t, const std::string& why, uint64_t, FailureEvidence) { failure = why; };
  dev->addPeer(0, "tcp:127.0.0.1:1", "rank 0");
  dev->setEpoch(1);
  Intruder peer(*dev, 0);
  constexpr uint64_t kSmall = 1, kBulk = 2, kLater = 3, kWindow = 128 << 10;
  std::vector<uint8_t> bulk(2 << 20, 0xab);
  uint64_t value = 42;
  auto first = dev->isend(0, kSmall, 0, &value, 8);  // a foreground send: the lane is busy from here on
  auto sb = dev->isendBulk(0, kBulk, 0, bulk.data(), bulk.size());
  Drained d = drainUntilQuiet(peer, kBulk);
  EXPECT_EQ(d.bytesByOp[kSmall], 8u);
  EXPECT_EQ(d.bytesByOp[kBulk], kWindow) << "bulk written to a peer that reported no reads";
  auto later = dev->isend(0, kLater, 0, &value, 8);
  d = drainUntilQuiet(peer, kBulk);
  EXPECT_EQ(d.bytesByOp[kLater], 8u) << "a foreground send waited behind bulk held back";
  EXPECT_EQ(d.bytesByOp[kBulk], 0u);
  reportBulkRead(peer, kWindow);
  d = drainUntilQuiet(peer, kBulk);
  EXPECT_EQ(d.bytesByOp[kBulk], kWindow) << "after the peer reported reading what it had";
  EXPECT_TRUE(d.flagsRight) << "a bulk frame not marked for counting, or another frame marked";
  dev->wait(first, deadlineAfterMs(3000), "send");
  dev->wait(later, deadlineAfterMs(3000), "send");
  EXPECT_EQ(sb->state.load(), Request::kPending);
  reportBulkRead(peer, 64 << 20);  // more than was ever sent
  try {
    dev->wait(sb, deadlineAfterMs(3000), "bulk send");
    FAIL() << "a bulk send outlived a peer that misreported its reads";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("said it read 67108864 bytes of bulk frames on lane 0, of 262144 sent"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
  }
  EXPECT_EQ(dev->stats().framesRejected, 1u);
}

TEST(TcpDevice, TruncatedFrameIsAClosedConnection) {
  auto dev = memberThreeDevice();
  dev->onPeerFailure = [](MemberId, ecclResult_t, const std::string&, uint64_t, FailureEvidence) {};
  dev->addPeer(0, "tcp:127.0.0.1:1", "rank 0");
  int64_t v;
  auto r = dev->irecv(0, 1, 0, &v, 8);
  {
    Intruder peer(*dev, 0);
    uint8_t buf[FrameHeader::kSize];
    encodeFrame(dataFrame(0, 1, 8), buf);
    peer.sendRaw(buf, sizeof(buf));
    const uint8_t partial[3] = {1, 2, 3};  // not &v: the device may be writing v meanwhile
    peer.sendRaw(partial, sizeof(partial));  // then hang up mid-payload
  }
  try {
    dev->wait(r, deadlineAfterMs(3000), "recv");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("closed the connection"), std::string::npos) << e.what();
  }
}

TEST(TcpDevice, WrongSecretAndNonMembersAreRejected) {
  Pair p;
  // Wrong secret: the handshake fails on both sides.
  {
    Fd fd = connectTo(tcpAddress(*p.b), deadlineAfterMs(2000), "stranger");
    Secret wrong;
    wrong.fill(9);
    EXPECT_THROW(membership::authenticateAsClient(fd.get(), wrong, {membership::Purpose::kData, 5, 0, 1, 0},
                                                 deadlineAfterMs(2000), "stranger"),
                 Error);
  }
  // Right secret, but a member id that is not in the communicator.
  { Intruder stranger(*p.b, 77); }
  // Garbage instead of a hello.
  {
    Fd fd = connectTo(tcpAddress(*p.b), deadlineAfterMs(2000), "garbage");
    const char junk[64] = "GET / HTTP/1.1\r\n\r\n";
    sendAll(fd.get(), junk, sizeof(junk), deadlineAfterMs(2000), "garbage");
  }
  for (int i = 0; i < 300 && p.b->stats().connectionsRejected < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(p.b->stats().connectionsRejected, 3u);
  // The real members still talk.
  int x = 41, y = 0;
  auto r = p.b->irecv(0, 1, 0, &y, 4);
  p.a->wait(p.a->isend(1, 1, 0, &x, 4), deadlineAfterMs(3000), "send");
  p.b->wait(r, deadlineAfterMs(3000), "recv");
  EXPECT_EQ(y, 41);
}

// A process on this host that does not hold the job's secret reaches the
// member's shared-memory socket (anyone in the namespace can) but gets no
// segment and no lane.
TEST(ShmDevice, WrongSecretOnTheLocalSocketIsRejected) {
  Pair p(1, "shm");
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::string name = partOf(*p.b, "shm");
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  ASSERT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), len), 0) << strerror(errno);
  Secret wrong;
  wrong.fill(9);
  EXPECT_THROW(membership::authenticateAsClient(fd.get(), wrong, {membership::Purpose::kData, 5, 0, 1, 0},
                                               deadlineAfterMs(2000), "stranger"),
               Error);
  for (int i = 0; i < 300 && p.b->stats().connectionsRejected < 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(p.b->stats().connectionsRejected, 1u);
  int x = 41, y = 0;
  auto r = p.b->irecv(0, 1, 0, &y, 4);
  p.a->wait(p.a->isend(1, 1, 0, &x, 4), deadlineAfterMs(3000), "send");
  p.b->wait(r, deadlineAfterMs(3000), "recv");
  EXPECT_EQ(y, 41);
  EXPECT_EQ(p.b->stats().openByBackEnd.at("shm"), 1u);
}

// Forcing shared memory to a member it cannot reach (here: a member id with
// no local socket) is a clear error, not a silent TCP fallback.
TEST(ShmDevice, ForcedSharedMemoryToAnUnreachableMemberFailsClearly) {
  DeviceOptions o = loopbackOptions("shm", 6, 1, 0);
  o.handshakeTimeoutMs = 1000;
  std::string failure;  // declared first: outlives the device's threads
  auto dev = createDevice(o);
  dev->onPeerFailure = [&](MemberId, ecclResult_t, const std::string& why, uint64_t, FailureEvidence) { failure = why; };
  dev->addPeer(1, "tcp:127.0.0.1:1", "rank 1");
  dev->setEpoch(1);
  int x = 0;
  try {
    dev->wait(dev->isend(1, 1, 0, &x, 4), deadlineAfterMs(2000), "send");
    FAIL() << "sent to an unreachable member";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no back end used here (shm) reaches the peer"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace eccl::transport
