// The verbs building blocks against a real kernel verbs provider: run
// inside scripts/rdma-vm.sh (Soft-RoCE), where ECCL_RDMA_VM_DEV names the
// device; elsewhere each test skips with one line saying why.
#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "common/error.h"
#include "transport/ibverbs/ring_lane.h"
#include "transport/ibverbs/verbs.h"

namespace eccl::transport::ibverbs {
namespace {

const char* vmDevice() { return std::getenv("ECCL_RDMA_VM_DEV"); }

#define NEEDS_RDMA_VM()                                                                  \
  if (!vmDevice()) GTEST_SKIP() << "no RDMA device here: run under scripts/rdma-vm.sh"; \
  static_assert(true)

// Two queue pairs of this process connected to each other over the one
// device (the kernel loops the packets), each with its own queues.
struct Pair {
  std::unique_ptr<Context> context = Context::open(vmDevice(), -1);
  CompletionQueue cqA{*context, 64}, cqB{*context, 64};
  QueuePair a{*context, cqA, cqA, {}}, b{*context, cqB, cqB, {}};
  Pair() {
    a.connect(b.endpoint());
    b.connect(a.endpoint());
  }
};

TEST(Verbs, TheDeviceOpensWithTheGidOfItsIpv4Address) {
  NEEDS_RDMA_VM();
  auto context = Context::open(vmDevice(), -1);
  EXPECT_EQ(context->name(), vmDevice());
  EXPECT_TRUE(context->ethernet());
  // 169.254.77.1 as an IPv4-mapped GID: ::ffff:a9fe:4d01.
  const uint8_t want[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 169, 254, 77, 1};
  EXPECT_EQ(std::memcmp(context->gid().raw, want, 16), 0) << context->describe();
  // The sysfs table agrees about the index chosen.
  std::ifstream type("/sys/class/infiniband/" + context->name() + "/ports/1/gid_attrs/types/" +
                     std::to_string(context->gidIndex()));
  std::string line;
  std::getline(type, line);
  EXPECT_EQ(line, "RoCE v2");
  // An explicit index is taken as it is; one past the table is refused.
  EXPECT_EQ(Context::open(vmDevice(), 0)->gidIndex(), 0);
  EXPECT_THROW(Context::open(vmDevice(), 100000), Error);
}

TEST(Verbs, AMissingDeviceIsRefusedNamingTheOnesThereAre) {
  NEEDS_RDMA_VM();
  try {
    Context::open("mlx5_9", -1);
    FAIL() << "opened a device that does not exist";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(vmDevice()), std::string::npos) << e.what();
  }
}

TEST(Verbs, AWriteWithImmediateLandsByteForByteAndASendMatchesAReceive) {
  NEEDS_RDMA_VM();
  Pair p;
  RegistrationCache cache(*p.context, 64 << 20);
  std::vector<uint8_t> source(1 << 20), target(1 << 20, 0);
  std::iota(source.begin(), source.end(), 7);
  ibv_mr* src = cache.acquire(source.data(), source.size());
  ibv_mr* dst = cache.acquire(target.data(), target.size());
  p.b.postRecv(11, nullptr, 0, 0);  // a write with immediate consumes a receive
  p.a.postWrite(1, source.data(), static_cast<uint32_t>(source.size()), src->lkey,
                reinterpret_cast<uintptr_t>(target.data()), dst->rkey, 0xecc1, true);
  ibv_wc sent = p.cqA.waitOne(deadlineAfterMs(20000), "the write");
  EXPECT_EQ(sent.status, IBV_WC_SUCCESS) << ibv_wc_status_str(sent.status);
  ibv_wc got = p.cqB.waitOne(deadlineAfterMs(20000), "the immediate");
  ASSERT_EQ(got.status, IBV_WC_SUCCESS) << ibv_wc_status_str(got.status);
  EXPECT_EQ(got.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(ntohl(got.imm_data), 0xecc1u);
  EXPECT_EQ(got.wr_id, 11u);
  EXPECT_EQ(source, target);
  // A send goes into the posted receive and says how long it was.
  std::vector<uint8_t> small(100, 42), landing(4096, 0);
  ibv_mr* land = cache.acquire(landing.data(), landing.size());
  ibv_mr* out = cache.acquire(small.data(), small.size());
  p.b.postRecv(12, landing.data(), static_cast<uint32_t>(landing.size()), land->lkey);
  p.a.postSend(2, small.data(), static_cast<uint32_t>(small.size()), out->lkey, true);
  EXPECT_EQ(p.cqA.waitOne(deadlineAfterMs(20000), "the send").status, IBV_WC_SUCCESS);
  got = p.cqB.waitOne(deadlineAfterMs(20000), "the receive");
  ASSERT_EQ(got.status, IBV_WC_SUCCESS) << ibv_wc_status_str(got.status);
  EXPECT_EQ(got.byte_len, 100u);
  EXPECT_EQ(landing[0], 42);
  EXPECT_EQ(landing[99], 42);
  EXPECT_EQ(landing[100], 0);
}

// A forged rkey (not the one the target's registration has) is refused by
// the target's device: the writer's completion fails, nothing is written,
// and the writer's queue pair is in error from then on.
TEST(Verbs, AForgedRkeyIsRefusedAndNothingIsWritten) {
  NEEDS_RDMA_VM();
  Pair p;
  RegistrationCache cache(*p.context, 64 << 20);
  std::vector<uint8_t> source(8192, 0xab), target(8192, 0);
  ibv_mr* src = cache.acquire(source.data(), source.size());
  ibv_mr* dst = cache.acquire(target.data(), target.size());
  p.a.postWrite(1, source.data(), static_cast<uint32_t>(source.size()), src->lkey,
                reinterpret_cast<uintptr_t>(target.data()), dst->rkey ^ 0x5a5a00, std::nullopt, true);
  ibv_wc wc = p.cqA.waitOne(deadlineAfterMs(30000), "the forged write");
  EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(std::count(target.begin(), target.end(), 0), static_cast<long>(target.size()));
  EXPECT_EQ(p.a.state(), IBV_QPS_ERR);
}

// A queue pair connected to a number that no longer answers (the peer's
// queue pair was destroyed: a stale offer) or to one that belongs to
// another connection (a forged number, with a PSN its owner does not
// expect) writes nothing through: no byte lands and no write succeeds.
// Soft-RoCE (6.1) then retransmits without ever failing the write, where an
// HCA reports retry exceeded; eccl's lanes keep their bootstrap stream as
// the liveness line for that reason (and offers only ever arrive on it).
TEST(Verbs, AStaleOrForgedQueuePairNumberWritesNothingThrough) {
  NEEDS_RDMA_VM();
  auto context = Context::open(vmDevice(), -1);
  RegistrationCache cache(*context, 64 << 20);
  std::vector<uint8_t> source(8192, 0xcd), target(8192, 0);
  ibv_mr* src = cache.acquire(source.data(), source.size());
  ibv_mr* dst = cache.acquire(target.data(), target.size());
  for (bool stale : {true, false}) {
    SCOPED_TRACE(stale ? "stale" : "forged");
    CompletionQueue cqWriter(*context, 64), cqOther(*context, 64);
    QueuePair writer(*context, cqWriter, cqWriter, {});
    QueuePair partner(*context, cqOther, cqOther, {});
    auto bystander = std::make_unique<QueuePair>(*context, cqOther, cqOther, QueuePair::Limits{});
    bystander->connect(partner.endpoint());
    partner.connect(bystander->endpoint());
    Endpoint claimed = bystander->endpoint();
    claimed.psn ^= 0x5a5a5a;
    if (stale) bystander.reset();
    writer.connect(claimed);
    writer.postWrite(7, source.data(), static_cast<uint32_t>(source.size()), src->lkey,
                     reinterpret_cast<uintptr_t>(target.data()), dst->rkey, std::nullopt, true);
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    ibv_wc wc{};
    int got = 0;
    while (got == 0 && std::chrono::steady_clock::now() < until) {
      got = cqWriter.poll(&wc, 1);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (got) EXPECT_NE(wc.status, IBV_WC_SUCCESS) << "the misdirected write completed";
    EXPECT_EQ(std::count(target.begin(), target.end(), 0), static_cast<long>(target.size()));
  }
}

TEST(Verbs, TheRegistrationCacheReusesCoveringRangesAndEvictsWhatNobodyHolds) {
  NEEDS_RDMA_VM();
  auto context = Context::open(vmDevice(), -1);
  constexpr size_t kPiece = 512 << 10;
  RegistrationCache cache(*context, 2 * kPiece);
  std::vector<uint8_t> memory(8 * kPiece);
  ibv_mr* first = cache.acquire(memory.data(), kPiece);
  EXPECT_EQ(cache.acquire(memory.data() + 100, 1000), first) << "a range inside a registration was registered again";
  cache.release(first);
  cache.release(first);
  ibv_mr* held = cache.acquire(memory.data() + kPiece, kPiece);
  for (int i = 2; i < 8; ++i) cache.release(cache.acquire(memory.data() + i * kPiece, kPiece));
  auto s = cache.stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.registrations, 8u);
  EXPECT_LE(s.bytes, 2 * kPiece) << "over its cap";
  EXPECT_GE(s.evictions, 6u);
  // The held registration survived every eviction and still works.
  EXPECT_EQ(cache.acquire(memory.data() + kPiece + 10, 10), held);
  cache.release(held);
  cache.release(held);
  EXPECT_THROW(cache.release(held), Error) << "released more often than acquired";
}


// Two lanes of this process over the one device, as two peers' lanes are:
// a socketpair stands for the authenticated stream they keep.
struct LanePair {
  std::unique_ptr<Context> context = Context::open(vmDevice(), -1);
  std::unique_ptr<RingLane> a, b;
  LanePair(size_t ringA, size_t ringB) {
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) throw std::runtime_error("socketpair");
    a = std::make_unique<RingLane>(*context, Fd(fds[0]), ringA, "lane a");
    b = std::make_unique<RingLane>(*context, Fd(fds[1]), ringB, "lane b");
    a->connect(b->offer());
    b->connect(a->offer());
  }
};

uint8_t streamByte(uint64_t i, int seed) { return static_cast<uint8_t>((i * 131 + (i >> 9) * 7 + seed) & 0xff); }

// Both directions at once through small rings (64 KiB one way, 16 KiB the
// other), in uneven pieces, the way the device's progress loop drives a
// lane: write what fits, read what came, and sleep on pollFd() after
// armWakeup() when neither moves. Every byte arrives, in order.
TEST(RingLane, StreamsBothWaysThroughSmallRingsWithCreditsAndWakeups) {
  NEEDS_RDMA_VM();
  LanePair p(64 << 10, 16 << 10);
  constexpr uint64_t kBytes = 8 << 20;
  struct Side {
    RingLane* lane;
    int seed;
    uint64_t sent = 0, received = 0;
  } sides[2] = {{p.a.get(), 1}, {p.b.get(), 2}};
  std::mt19937 rng(7);
  std::vector<uint8_t> out(300 << 10), in(300 << 10);
  auto stop = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  int sleeps = 0;
  while (sides[0].received < kBytes || sides[1].received < kBytes) {
    ASSERT_LT(std::chrono::steady_clock::now(), stop) << "stalled: a sent " << sides[0].sent << ", b received "
                                                      << sides[1].received;
    bool moved = false;
    for (int s = 0; s < 2; ++s) {
      Side& me = sides[s];
      Side& other = sides[1 - s];
      if (me.sent < kBytes) {
        size_t n = std::min<uint64_t>(kBytes - me.sent, 1 + rng() % (200 << 10));
        for (size_t i = 0; i < n; ++i) out[i] = streamByte(me.sent + i, me.seed);
        size_t cut = n / 3;
        iovec iov[2] = {{out.data(), cut}, {out.data() + cut, n - cut}};
        ssize_t w = me.lane->write(iov, 2);
        ASSERT_GE(w, 0) << strerror(errno);
        me.sent += static_cast<uint64_t>(w);
        moved = moved || w > 0;
      }
      ssize_t r = other.lane->read(in.data(), 1 + rng() % in.size());
      if (r < 0) ASSERT_EQ(errno, EAGAIN) << strerror(errno);
      ASSERT_NE(r, 0) << "end of stream while the peer lives";
      for (ssize_t i = 0; i < r; ++i)
        ASSERT_EQ(in[i], streamByte(other.received + i, me.seed)) << "byte " << other.received + i;
      if (r > 0) other.received += static_cast<uint64_t>(r), moved = true;
    }
    if (moved) continue;
    // Neither side can move: both sleep until a completion says otherwise.
    bool sleepA = p.a->armWakeup(sides[0].sent < kBytes);
    bool sleepB = p.b->armWakeup(sides[1].sent < kBytes);
    if (sleepA && sleepB) {
      pollfd fds[2] = {{p.a->pollFd(), POLLIN, 0}, {p.b->pollFd(), POLLIN, 0}};
      ASSERT_GT(::poll(fds, 2, 5000), 0) << "no wake-up while bytes were owed";
      p.a->onPollReady();
      p.b->onPollReady();
      ++sleeps;
    }
  }
  EXPECT_EQ(sides[0].sent, kBytes);
  EXPECT_EQ(sides[1].received, kBytes);
  RecordProperty("sleeps", sleeps);
}

// The peer's process dies: its stream closes (the lane reads end of file
// once the ring is drained) and its queue pair goes, so writes fail.
TEST(RingLane, APeerThatGoesEndsTheStreamAndFailsWrites) {
  NEEDS_RDMA_VM();
  LanePair p(16 << 10, 16 << 10);
  uint8_t hello[100] = {1};
  iovec iov{hello, sizeof(hello)};
  ASSERT_EQ(p.b->write(&iov, 1), 100);
  p.b.reset();
  uint8_t got[200];
  auto stop = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  ssize_t r;
  size_t total = 0;
  while ((r = p.a->read(got, sizeof(got))) != 0) {
    if (r > 0) total += static_cast<size_t>(r);
    ASSERT_LT(std::chrono::steady_clock::now(), stop) << "no end of stream";
  }
  EXPECT_EQ(total, 100u) << "what the peer sent before it went was lost";
  std::vector<uint8_t> big(4096, 9);
  iovec more{big.data(), big.size()};
  stop = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    ssize_t w = p.a->write(&more, 1);
    if (w < 0) {
      EXPECT_EQ(errno, ECONNRESET);
      break;
    }
    ASSERT_LT(std::chrono::steady_clock::now(), stop) << "writes to a peer that is gone never failed";
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

TEST(RingLane, AMalformedOfferIsRefused) {
  NEEDS_RDMA_VM();
  auto context = Context::open(vmDevice(), -1);
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  Fd keep(fds[1]);
  RingLane lane(*context, Fd(fds[0]), 16 << 10, "lane");
  LaneOffer bad = lane.offer();
  bad.ringBytes = 5000;
  EXPECT_THROW(lane.connect(bad), Error);
  bad = lane.offer();
  bad.ringAddress = 0;
  EXPECT_THROW(lane.connect(bad), Error);
  EXPECT_THROW(RingLane(*context, Fd(), 3000, "odd"), Error);
}

}  // namespace
}  // namespace eccl::transport::ibverbs
