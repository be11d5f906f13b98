// libnccl-net-eccl.so driven as NCCL drives it, every exported version,
// between real processes: data checked byte for byte, grouped receives by
// tag, 32 requests in flight, killed and stopped peers, the pool across an
// unload, and bad input.
#include <gtest/gtest.h>

#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "net_plugin/harness/net_api.h"
#include "net_plugin/harness/procs.h"

namespace eccl::test {
namespace {

using namespace std::chrono_literals;

#define NET_OK(call)                                                                               \
  do {                                                                                             \
    ncclResult_t rc_ = (call);                                                                     \
    if (rc_ != ncclSuccess) throw std::runtime_error(std::string(#call) + " -> " + std::to_string(rc_)); \
  } while (0)
#define CHECK(cond, msg)                                                                           \
  do {                                                                                             \
    if (!(cond)) throw std::runtime_error(std::string(__FILE__ ":") + std::to_string(__LINE__) + ": " + #cond + ": " + (msg)); \
  } while (0)

// Calls fn until it hands out a non-null object, as NCCL's proxy does.
template <typename F>
void* until(F&& fn, const char* what, std::chrono::milliseconds limit = 20000ms) {
  auto stop = std::chrono::steady_clock::now() + limit;
  for (;;) {
    void* out = nullptr;
    ncclResult_t rc = fn(&out);
    if (rc != ncclSuccess) throw std::runtime_error(std::string(what) + " -> " + std::to_string(rc));
    if (out) return out;
    if (std::chrono::steady_clock::now() > stop) throw std::runtime_error(std::string(what) + " never completed");
    std::this_thread::yield();
  }
}

// Tests until done; returns the sizes.
std::vector<int> finish(NetApi& net, void* request, int n = 1, std::chrono::milliseconds limit = 30000ms) {
  std::vector<int> sizes(n, -1);
  auto stop = std::chrono::steady_clock::now() + limit;
  for (int done = 0; !done;) {
    NET_OK(net.test(request, &done, sizes.data()));
    if (!done && std::chrono::steady_clock::now() > stop) throw std::runtime_error("a request never completed");
  }
  return sizes;
}

struct Pair {
  void* listen = nullptr;
  void* send = nullptr;  // to the next rank
  void* recv = nullptr;  // from the previous rank
};

// A ring: every rank listens, sends to the next and receives from the
// previous, the way NCCL's ring connects.
Pair ring(NetApi& net, int rank, int nranks) {
  Pair p;
  char handle[kBlob] = {};
  NET_OK(net.listen(handle, &p.listen));
  auto all = Ranks::allgather(handle);
  std::string next = all[(rank + 1) % nranks];
  // Connect and accept are interleaved: neither may wait for the other.
  for (auto stop = std::chrono::steady_clock::now() + 20s; !p.send || !p.recv;) {
    if (!p.send) NET_OK(net.connect(next.data(), &p.send));
    if (!p.recv) NET_OK(net.accept(p.listen, &p.recv));
    CHECK(std::chrono::steady_clock::now() < stop, "the ring did not connect");
  }
  return p;
}

// The end of a job as NCCL ends it: every rank's requests complete (its
// bootstrap barrier), then the comms close. A rank that exited as soon as
// its own sends completed took its end away while the peer still had
// bytes in flight to read (a grouped receive failed so, under ASan on a
// loaded machine: 1 in 300).
void closeAfterEveryRank(NetApi& net, const Pair& p) {
  char done[kBlob] = {};
  Ranks::allgather(done);
  NET_OK(net.closeSend(p.send));
  NET_OK(net.closeRecv(p.recv));
  NET_OK(net.closeListen(p.listen));
  NET_OK(net.finalize());
}

void fillPattern(std::vector<uint8_t>& v, uint64_t seed) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& b : v) x ^= x << 13, x ^= x >> 7, x ^= x << 17, b = static_cast<uint8_t>(x);
}

std::string pluginPath() { return ECCL_NET_PLUGIN_PATH; }

class EachVersion : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    setenv("ECCL_SOCKET_IFNAME", "lo", 1);
    setenv("ECCL_NET_POOL_IDLE_MS", "60000", 1);
  }
  void runRanks(int nranks, Ranks::Body body, std::chrono::seconds deadline = 120s) {
    auto outcome = Ranks::run(nranks, body, deadline);
    for (int r = 0; r < nranks; ++r) EXPECT_EQ(outcome[r], "") << "rank " << r;
  }
};

INSTANTIATE_TEST_SUITE_P(Net, EachVersion, ::testing::Values(8, 9, 10, 11, 12),
                         [](const auto& info) { return "v" + std::to_string(info.param); });

TEST_P(EachVersion, PropertiesDescribeAHostMemoryNic) {
  int version = GetParam();
  runRanks(1, [version](int, int) {
    NetApi net(pluginPath().c_str(), version);
    CHECK(std::string(net.name()) == "eccl", net.name());
    NET_OK(net.init());
    int n = 0;
    NET_OK(net.devices(&n));
    CHECK(n == 1, std::to_string(n));
    ncclNetProperties_v8_t p{};
    int maxRecvs = 0;
    NET_OK(net.properties(0, &p, &maxRecvs));
    CHECK(p.ptrSupport == NCCL_PTR_HOST, "host memory only");
    CHECK(std::string(p.name) == "eccl:lo", p.name);
    CHECK(p.speed > 0 && maxRecvs == 8 && p.netDeviceType == NCCL_NET_DEVICE_HOST, "properties");
    CHECK(net.properties(1, &p, nullptr) != ncclSuccess, "device 1 does not exist");
    NET_OK(net.finalize());
  });
}

// Sizes from nothing to 64 MiB, each into a receive larger than the
// message: test() reports what came, and every byte is checked.
TEST_P(EachVersion, EverySizeArrivesIntactIntoALargerReceive) {
  int version = GetParam();
  runRanks(2, [version](int rank, int nranks) {
    NetApi net(pluginPath().c_str(), version);
    NET_OK(net.init());
    Pair p = ring(net, rank, nranks);
    for (size_t size : {size_t{0}, size_t{1}, size_t{7}, size_t{4096}, size_t{1} << 20, size_t{64} << 20}) {
      std::vector<uint8_t> out(size), in(size + 4096, 0xee);
      fillPattern(out, size * 2 + rank);
      void* data = in.data();
      size_t cap = in.size();
      int tag = 5;
      void* r = until([&](void** req) { return net.irecv(p.recv, 1, &data, &cap, &tag, req); }, "irecv");
      void* s = until([&](void** req) { return net.isend(p.send, out.data(), size, tag, req); }, "isend");
      finish(net, s);
      auto got = finish(net, r);
      CHECK(got[0] == static_cast<int>(size), "size " + std::to_string(got[0]) + " for " + std::to_string(size));
      std::vector<uint8_t> expect(size);
      fillPattern(expect, size * 2 + (rank + nranks - 1) % nranks);
      CHECK(std::equal(expect.begin(), expect.end(), in.begin()), "data of " + std::to_string(size) + " bytes");
      CHECK(std::all_of(in.begin() + static_cast<long>(size), in.end(), [](uint8_t b) { return b == 0xee; }),
            "wrote past the message");
      void* flush = reinterpret_cast<void*>(1);
      NET_OK(net.iflush(p.recv, &flush));
      CHECK(flush == nullptr, "host memory needs no flush");
    }
    closeAfterEveryRank(net, p);
  });
}

// A grouped receive takes each send into the buffer its tag picks, in send
// order among equal tags, whatever order the sends come in: sends up to the
// eager bound (32 KiB) carry their bytes at once, larger ones go into the
// buffer the receive announced, and groups of each kind follow one another
// on the same comms (all-small buffers need no clear-to-send; a small send
// into a large buffer withdraws the posted one).
TEST_P(EachVersion, AGroupedReceiveMatchesEachSendByTag) {
  int version = GetParam();
  runRanks(2, [version](int rank, int nranks) {
    NetApi net(pluginPath().c_str(), version);
    NET_OK(net.init());
    Pair p = ring(net, rank, nranks);
    struct Group {
      std::vector<int> tags;
      std::vector<size_t> caps, sizes;
    };
    Group small{{10, 11, 12, 13}, {1000, 1000, 1000, 1000}, {100, 200, 300, 400}};
    Group mixed{{7, 7, 9, 9}, {200000, 1000, 200000, 200000}, {150000, 500, 20, 90000}};
    int from = (rank + nranks - 1) % nranks;
    int round = 0;
    for (Group* g : {&small, &mixed, &small, &mixed}) {
      std::vector<std::vector<uint8_t>> in(4), out(4);
      void* data[4];
      for (int i = 0; i < 4; ++i) {
        in[i].assign(g->caps[i], 0);
        data[i] = in[i].data();
        out[i].resize(g->sizes[i]);
        fillPattern(out[i], round * 100 + rank * 10 + i);
      }
      void* r = until([&](void** req) { return net.irecv(p.recv, 4, data, g->caps.data(), g->tags.data(), req); },
                      "irecv");
      std::vector<void*> sends;
      for (int i : {2, 0, 3, 1})  // equal tags keep their order: 0 before 1, 2 before 3
        sends.push_back(until(
            [&](void** req) { return net.isend(p.send, out[i].data(), out[i].size(), g->tags[i], req); }, "isend"));
      for (void* s : sends) finish(net, s);
      auto sizes = finish(net, r, 4);
      for (int i = 0; i < 4; ++i) {
        std::vector<uint8_t> expect(g->sizes[i]);
        fillPattern(expect, round * 100 + from * 10 + i);
        std::string where = "round " + std::to_string(round) + " buffer " + std::to_string(i);
        CHECK(sizes[i] == static_cast<int>(g->sizes[i]), where + " size " + std::to_string(sizes[i]));
        CHECK(std::equal(expect.begin(), expect.end(), in[i].begin()), where + ": wrong bytes");
      }
      ++round;
    }
    closeAfterEveryRank(net, p);
  });
}

// NCCL keeps up to 32 requests per comm in flight and tests them in any order.
TEST_P(EachVersion, ThirtyTwoRequestsInFlightCompleteInAnyTestOrder) {
  int version = GetParam();
  runRanks(2, [version](int rank, int nranks) {
    NetApi net(pluginPath().c_str(), version);
    NET_OK(net.init());
    Pair p = ring(net, rank, nranks);
    constexpr int kN = 32;
    std::vector<std::vector<uint8_t>> in(kN, std::vector<uint8_t>(70000)), out(kN, std::vector<uint8_t>(70000));
    std::vector<void*> recvs, sends;
    for (int i = 0; i < kN; ++i) {
      fillPattern(out[i], 1000 + i * 10 + rank);
      void* data = in[i].data();
      size_t cap = in[i].size();
      int tag = 1;
      recvs.push_back(until([&](void** req) { return net.irecv(p.recv, 1, &data, &cap, &tag, req); }, "irecv"));
    }
    void* extra = nullptr;
    {
      void* data = in[0].data();
      size_t cap = 1;
      int tag = 1;
      NET_OK(net.irecv(p.recv, 1, &data, &cap, &tag, &extra));
      CHECK(extra == nullptr, "a 33rd request was taken");
    }
    for (int i = 0; i < kN; ++i)
      sends.push_back(until([&](void** req) { return net.isend(p.send, out[i].data(), out[i].size(), 1, req); },
                            "isend"));
    std::vector<int> order(kN);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(rank + 7));
    for (int i : order) finish(net, recvs[i]);
    std::reverse(order.begin(), order.end());
    for (int i : order) finish(net, sends[i]);
    int from = (rank + nranks - 1) % nranks;
    for (int i = 0; i < kN; ++i) {
      std::vector<uint8_t> expect(70000);
      fillPattern(expect, 1000 + i * 10 + from);
      CHECK(expect == in[i], "message " + std::to_string(i) + " (posting order)");
    }
    closeAfterEveryRank(net, p);
  });
}

// A peer that dies (SIGKILL) or stops (SIGSTOP) with requests outstanding:
// every one of them fails in test() within ECCL_TIMEOUT_MS, not only the
// first (NCCL tests in order and would hang on the rest otherwise).
void everyRequestFailsWhenThePeerGoes(int version, int sig) {
  setenv("ECCL_TIMEOUT_MS", "3000", 1);
  auto outcome = Ranks::run(2, [version, sig](int rank, int nranks) {
    NetApi net(pluginPath().c_str(), version);
    NET_OK(net.init());
    Pair p = ring(net, rank, nranks);
    // One message each way proves the lanes, then rank 1 goes.
    std::vector<uint8_t> buf(1 << 16, 1), in(1 << 16);
    void* data = in.data();
    size_t cap = in.size();
    int tag = 0;
    void* r = until([&](void** req) { return net.irecv(p.recv, 1, &data, &cap, &tag, req); }, "irecv");
    void* s = until([&](void** req) { return net.isend(p.send, buf.data(), buf.size(), 0, req); }, "isend");
    finish(net, s);
    finish(net, r);
    char ready[kBlob] = {};
    Ranks::allgather(ready);
    if (rank == 1) raise(sig);
    std::vector<std::vector<uint8_t>> bufs(8, std::vector<uint8_t>(1 << 16));
    std::vector<void*> pending;
    for (int i = 0; i < 8; ++i) {
      void* d = bufs[i].data();
      size_t c = bufs[i].size();
      void* req = nullptr;
      ncclResult_t posted = net.irecv(p.recv, 1, &d, &c, &tag, &req);
      // Posting may already know the peer is gone: the failure then comes
      // from irecv itself, and nothing more can be posted.
      if (posted != ncclSuccess) {
        CHECK(posted == ncclRemoteError, "irecv result " + std::to_string(posted));
        break;
      }
      CHECK(req, "irecv refused");
      pending.push_back(req);
    }
    auto start = std::chrono::steady_clock::now();
    for (void* req : pending) {
      for (;;) {
        int done = 0;
        ncclResult_t rc = net.test(req, &done, nullptr);
        CHECK(!done, "a receive from a dead peer completed");
        if (rc != ncclSuccess) {
          CHECK(rc == ncclRemoteError, "result " + std::to_string(rc));
          break;
        }
        CHECK(std::chrono::steady_clock::now() - start < 6s, "not failed within the timeout");
        std::this_thread::sleep_for(1ms);
      }
    }
  }, 60s);
  EXPECT_EQ(outcome[0], "");
}

TEST_P(EachVersion, AKilledPeerFailsEveryOutstandingRequest) { everyRequestFailsWhenThePeerGoes(GetParam(), SIGKILL); }
TEST_P(EachVersion, AStoppedPeerFailsEveryOutstandingRequest) { everyRequestFailsWhenThePeerGoes(GetParam(), SIGSTOP); }

// Connections outlive the communicator and the plugin's own unloading: the
// same ranks re-creating their comms open no connection; a third process
// (a replacement) costs exactly its own lanes.
TEST_P(EachVersion, AReCreatedCommunicatorReusesThePoolAcrossAnUnload) {
  int version = GetParam();
  setenv("ECCL_NSOCKS_PERPEER", "2", 1);
  runRanks(3, [version](int rank, int) {
    uint64_t before[4], after[4];
    auto exchange = [&](NetApi& net, int a, int b) {
      // Ranks a and b connect both ways; the third sits out.
      char handle[kBlob] = {};
      void* listen = nullptr;
      NET_OK(net.listen(handle, &listen));
      auto all = Ranks::allgather(handle);
      // The lower rank connects first; the higher one then finds the lanes
      // that dial opened and uses them (one lane set per pair).
      void* send = nullptr;
      void* recv = nullptr;
      int other = rank == a ? b : a;
      char turn[kBlob] = {};
      if (rank == a) send = until([&](void** c) { return net.connect(all[other].data(), c); }, "connect");
      Ranks::allgather(turn);
      if (rank == b) send = until([&](void** c) { return net.connect(all[other].data(), c); }, "connect");
      if (rank == a || rank == b) {
        recv = until([&](void** c) { return net.accept(listen, c); }, "accept");
        int x = rank, y = -1, tag = 0;
        void* data = &y;
        size_t cap = sizeof(y);
        void* r = until([&](void** req) { return net.irecv(recv, 1, &data, &cap, &tag, req); }, "irecv");
        void* s = until([&](void** req) { return net.isend(send, &x, sizeof(x), 0, req); }, "isend");
        finish(net, s);
        finish(net, r);
        CHECK(y == other, "got " + std::to_string(y));
        NET_OK(net.closeSend(send));
        NET_OK(net.closeRecv(recv));
      }
      NET_OK(net.closeListen(listen));
      char done[kBlob] = {};
      Ranks::allgather(done);
    };
    {
      NetApi net(pluginPath().c_str(), version);
      NET_OK(net.init(1));
      exchange(net, 0, 1);
      net.stats(before);
      NET_OK(net.finalize());
      net.unload();
    }
    NetApi net(pluginPath().c_str(), version);
    NET_OK(net.init(2));
    exchange(net, 0, 1);  // the same two ranks again
    net.stats(after);
    CHECK(after[0] == before[0], "re-creation opened " + std::to_string(after[0] - before[0]) + " connections");
    if (rank < 2) CHECK(after[2] > before[2], "the re-created comms were not served from the pool");
    exchange(net, 0, 2);  // rank 2 replaces rank 1
    uint64_t replaced[4];
    net.stats(replaced);
    uint64_t expected = rank == 1 ? 0 : 2;  // rank 2's lanes, one dial, one accept: 2 lanes each side
    CHECK(replaced[0] - after[0] == expected,
          "rank " + std::to_string(rank) + " opened " + std::to_string(replaced[0] - after[0]));
  });
}

// Pooled lanes are reaped after ECCL_NET_POOL_IDLE_MS (30 ms here) while
// the pair keeps re-creating its comms at intervals around that bound: a
// reap that crosses a new comm must never fail it (the two sides agree on
// a close first, a connect waits for their answer, and a process's fresh
// dial replaces the lanes it dropped). The engine is the same under every
// version: the newest drives it.
TEST(Pool, CommsMadeWhileThePoolIsReapedNeverFail) {
  const int version = 12;
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  setenv("ECCL_NET_POOL_IDLE_MS", "30", 1);
  auto outcome = Ranks::run(2, [version](int rank, int nranks) {
    NetApi net(pluginPath().c_str(), version);
    NET_OK(net.init());
    std::mt19937 rng(1234);  // the same pauses on both sides: they meet around the bound
    for (int round = 0; round < 60; ++round) {
      Pair p = ring(net, rank, nranks);
      int x = round * 2 + rank, y = -1, tag = 0;
      void* data = &y;
      size_t cap = sizeof(y);
      void* r = until([&](void** q) { return net.irecv(p.recv, 1, &data, &cap, &tag, q); }, "irecv");
      void* s = until([&](void** q) { return net.isend(p.send, &x, sizeof(x), 0, q); }, "isend");
      finish(net, s, 1, 10000ms);
      finish(net, r, 1, 10000ms);
      CHECK(y == round * 2 + (1 - rank), "round " + std::to_string(round) + ": got " + std::to_string(y));
      NET_OK(net.closeSend(p.send));
      NET_OK(net.closeRecv(p.recv));
      NET_OK(net.closeListen(p.listen));
      std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 25));
    }
    uint64_t stats[4];
    net.stats(stats);
    CHECK(stats[1] > 1 && stats[2] > 1, "new and pooled lanes were not both exercised (new " +
                                            std::to_string(stats[1]) + ", pooled " + std::to_string(stats[2]) + ")");
  }, 120s);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(outcome[r], "") << "rank " << r;
  setenv("ECCL_NET_POOL_IDLE_MS", "60000", 1);
}

// A connect with a handle the listener will not honour fails: at connect
// (new lanes: the dial cannot prove the token) or at the first send (pooled
// lanes: the listener refuses the open).
void expectRefused(NetApi& net, const std::string& handle, const char* what) {
  void* comm = nullptr;
  ncclResult_t rc = ncclSuccess;
  for (auto stop = std::chrono::steady_clock::now() + 10s; rc == ncclSuccess && !comm;) {
    rc = net.connect(const_cast<char*>(handle.data()), &comm);
    CHECK(std::chrono::steady_clock::now() < stop, std::string(what) + ": connect neither failed nor completed");
  }
  if (rc != ncclSuccess) return;
  int x = 1;
  for (auto stop = std::chrono::steady_clock::now() + 10s; rc == ncclSuccess;) {
    void* req = nullptr;
    rc = net.isend(comm, &x, sizeof(x), 0, &req);
    CHECK(!req, std::string(what) + ": a send over a refused comm was taken");
    CHECK(std::chrono::steady_clock::now() < stop, std::string(what) + ": the comm never failed");
  }
  NET_OK(net.closeSend(comm));
}

// Handles that are not what they claim, null arguments, and a comm closed
// under its requests: each is an error (or, for the last, harmless), never
// a crash or a hang, and the plugin keeps working afterwards.
TEST_P(EachVersion, BadInputIsRefusedAndHarmsNothing) {
  int version = GetParam();
  runRanks(2, [version](int rank, int nranks) {
    NetApi net(pluginPath().c_str(), version);
    NET_OK(net.init());
    void* comm = reinterpret_cast<void*>(1);
    CHECK(net.listen(nullptr, &comm) != ncclSuccess, "listen(NULL)");
    char garbage[kBlob];
    std::memset(garbage, 0x5a, sizeof(garbage));
    comm = nullptr;
    CHECK(net.connect(garbage, &comm) == ncclInvalidArgument && !comm, "a garbage handle");
    char handle[kBlob] = {};
    void* listen = nullptr;
    NET_OK(net.listen(handle, &listen));
    auto all = Ranks::allgather(handle);
    std::string peer = all[(rank + 1) % nranks];
    // A wrong token: refused, and nothing reaches accept.
    std::string forged = peer;
    forged[30] ^= 1;
    expectRefused(net, forged, "a forged token");
    void* ignored = nullptr;
    CHECK(net.accept(listen, &ignored) == ncclSuccess && !ignored, "the forged open reached accept");
    // A comm closed with requests in flight: the buffers are let go.
    char ready[kBlob] = {};
    Ranks::allgather(ready);
    void* good = nullptr;
    void* recv = nullptr;
    while (!good || !recv) {
      if (!good) NET_OK(net.connect(peer.data(), &good));
      if (!recv) NET_OK(net.accept(listen, &recv));
    }
    {
      std::vector<uint8_t> doomed(1 << 20);
      void* data = doomed.data();
      size_t cap = doomed.size();
      int tag = 3;
      void* req = until([&](void** r) { return net.irecv(recv, 1, &data, &cap, &tag, r); }, "irecv");
      (void)req;
      NET_OK(net.closeRecv(recv));
    }
    Ranks::allgather(ready);
    // The stale handle (its listen comm closed) is refused like a forged one.
    NET_OK(net.closeListen(listen));
    Ranks::allgather(ready);
    expectRefused(net, peer, "a stale handle");
    NET_OK(net.closeSend(good));
    // Still working: a fresh pair.
    Pair p = ring(net, rank, nranks);
    int y = -1, tag = 9;
    void* data = &y;
    size_t cap = sizeof(y);
    void* r = until([&](void** req) { return net.irecv(p.recv, 1, &data, &cap, &tag, req); }, "irecv");
    void* s = until([&](void** req) { return net.isend(p.send, &rank, sizeof(rank), 9, req); }, "isend");
    finish(net, s);
    finish(net, r);
    CHECK(y == (rank + nranks - 1) % nranks, "after bad input");
  });
}

}  // namespace
}  // namespace eccl::test
