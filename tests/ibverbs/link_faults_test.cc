// Two ranks on two Soft-RoCE devices joined by a veth pair (scripts/rdma-vm.sh
// -n pair), so their RDMA packets cross a link the test can impair: packet
// loss that RC retransmission must hide, and a link that goes down, whose
// retry-exceeded completions must fail the ops naming the peer while the
// bootstrap streams (over loopback) stay up.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/multiproc.h"

namespace eccl::test {
namespace {

const char* env(const char* name) { return std::getenv(name); }

#define NEEDS_RDMA_PAIR()                                                                           \
  if (!env("ECCL_RDMA_VM_DEV2"))                                                                    \
    GTEST_SKIP() << "no pair of RDMA devices on a link here: run under scripts/rdma-vm.sh -n pair"; \
  static_assert(true)

void shell(const std::string& command) {
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
}

// Soft-RoCE's own counters of what the link did to it.
uint64_t counter(const char* device, const char* name) {
  std::ifstream in(std::string("/sys/class/infiniband/") + device + "/ports/1/hw_counters/" + name);
  uint64_t v = 0;
  in >> v;
  return v;
}

uint64_t retransmissionSigns() {
  uint64_t sum = 0;
  for (const char* device : {env("ECCL_RDMA_VM_DEV"), env("ECCL_RDMA_VM_DEV2")})
    for (const char* name : {"rcvd_seq_err", "duplicate_request", "out_of_seq_request", "completer_retry_err"})
      sum += counter(device, name);
  return sum;
}

class LinkFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("ECCL_TRANSPORT", "ib", 1);
    setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  }
  void TearDown() override {
    for (const char* dev : {env("ECCL_RDMA_VM_NETDEV"), env("ECCL_RDMA_VM_NETDEV2")}) {
      if (!dev) continue;
      std::system(("tc qdisc del dev " + std::string(dev) + " root 2>/dev/null").c_str());
      std::system(("ip link set " + std::string(dev) + " up").c_str());
    }
  }
  // Rank r uses the device on its end of the link.
  static void useOwnDevice(int rank) { setenv("ECCL_IB_HCA", env(rank == 0 ? "ECCL_RDMA_VM_DEV" : "ECCL_RDMA_VM_DEV2"), 1); }
};

TEST_F(LinkFaults, PacketLossIsHiddenByRetransmissionAndEveryByteArrives) {
  NEEDS_RDMA_PAIR();
  shell("modprobe sch_netem");
  const uint64_t before = retransmissionSigns();
  // The loss starts once the queue pairs are connected: it is the data path
  // RC retransmission must hide (address resolution for a queue pair's RTR
  // under loss can time out, which is a different fault).
  ReadyFiles ready;
  const std::string dir = ready.dir;
  ProcessGroup group(2, [dir](int rank, int n, const ecclUniqueId& id) {
    useOwnDevice(rank);
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, n, id, rank), nullptr);
    int32_t warm = 1;
    RANK_OK(ecclAllReduce(&warm, &warm, 1, ecclInt32, ecclSum, comm, nullptr), comm);
    std::vector<int32_t> pairWarm(4, rank), pairGot(4);
    RANK_OK(ecclGroupStart(), comm);
    RANK_OK(ecclSend(pairWarm.data(), 4, ecclInt32, 1 - rank, comm, nullptr), comm);
    RANK_OK(ecclRecv(pairGot.data(), 4, ecclInt32, 1 - rank, comm, nullptr), comm);
    RANK_OK(ecclGroupEnd(), comm);
    ReadyFiles::mark(dir, rank);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!std::filesystem::exists(dir + "/lossy")) {
      RANK_CHECK(std::chrono::steady_clock::now() < until, "the loss was never switched on");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    for (size_t count : {size_t(1), size_t(4099), size_t(1) << 20}) {
      std::vector<int32_t> v(count);
      for (size_t i = 0; i < count; ++i) v[i] = static_cast<int32_t>(i % 1000 + rank);
      RANK_OK(ecclAllReduce(v.data(), v.data(), count, ecclInt32, ecclSum, comm, nullptr), comm);
      for (size_t i = 0; i < count; ++i)
        RANK_CHECK(v[i] == static_cast<int32_t>(2 * (i % 1000) + 1), "allreduce of " + std::to_string(count) +
                                                                          ": element " + std::to_string(i) + " is " +
                                                                          std::to_string(v[i]));
      std::vector<int32_t> got(count, -1), mine(count);
      for (size_t i = 0; i < count; ++i) mine[i] = static_cast<int32_t>(i * 7 + rank);
      RANK_OK(ecclGroupStart(), comm);
      RANK_OK(ecclSend(mine.data(), count, ecclInt32, 1 - rank, comm, nullptr), comm);
      RANK_OK(ecclRecv(got.data(), count, ecclInt32, 1 - rank, comm, nullptr), comm);
      RANK_OK(ecclGroupEnd(), comm);
      for (size_t i = 0; i < count; ++i)
        RANK_CHECK(got[i] == static_cast<int32_t>(i * 7 + 1 - rank), "sendrecv element " + std::to_string(i));
    }
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  if (ready.waitAll(2, std::chrono::seconds(120))) {
    // Lost on the wire only: a packet the queue refuses (netem's default
    // limit of 1000, reached when the host is loaded and the queue is
    // emptied late) is a local drop, after which this kernel's Soft-RoCE
    // (6.1) resent a malformed write: the peer answered "invalid request"
    // and both queue pairs failed (CI, stop 62; here 2 runs in 11 at
    // "delay 2ms limit 8", none in 8 at "delay 2ms limit 1000000", none in
    // 10 at plain loss of 2-15%).
    for (const char* dev : {env("ECCL_RDMA_VM_NETDEV"), env("ECCL_RDMA_VM_NETDEV2")})
      shell("tc qdisc add dev " + std::string(dev) + " root netem loss 2% limit 1000000");
    if (FILE* f = std::fopen((dir + "/lossy").c_str(), "w")) std::fclose(f);
  }
  auto outcomes = group.wait(std::chrono::seconds(200));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
  EXPECT_GT(retransmissionSigns(), before) << "no packet was lost and retransmitted: the test proved nothing";
}

// The link goes down under running allreduces: nothing says so on the
// bootstrap streams, so the queue pairs' own failures (retry exceeded) must
// end the ops, naming the peer, well before the communicator's deadline.
TEST_F(LinkFaults, ALinkThatGoesDownFailsTheOpsNamingThePeer) {
  NEEDS_RDMA_PAIR();
  setenv("ECCL_TIMEOUT_MS", "60000", 1);
  ReadyFiles ready;
  const std::string dir = ready.dir;
  ProcessGroup group(2, [dir](int rank, int n, const ecclUniqueId& id) {
    useOwnDevice(rank);
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, n, id, rank), nullptr);
    std::vector<float> v(1 << 16, 1.0f);
    // The queue pairs exist once the first allreduce is done: the link must
    // fail under running ops, not under their connecting.
    RANK_OK(ecclAllReduce(v.data(), v.data(), v.size(), ecclFloat32, ecclSum, comm, nullptr), comm);
    ReadyFiles::mark(dir, rank);
    auto start = std::chrono::steady_clock::now();
    ecclResult_t r = ecclSuccess;
    while ((r = ecclAllReduce(v.data(), v.data(), v.size(), ecclFloat32, ecclSum, comm, nullptr)) == ecclSuccess)
      RANK_CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(50), "no op failed");
    std::string why = ecclGetLastError(comm);
    fprintf(stderr, "rank %d: failed after %.1f s: %s\n", rank,
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), why.c_str());
    // Both ends see the link fail; the first to tell the coordinator has the
    // other declared failed, and that one is evicted.
    RANK_CHECK(r == ecclRemoteError || r == ecclEvicted, std::string("got ") + ecclGetErrorString(r) + ": " + why);
    RANK_CHECK(why.find("rank " + std::to_string(1 - rank)) != std::string::npos, "the error names no peer: " + why);
    RANK_CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(40),
               "the failure took as long as a deadline: " + why);
    ecclCommAbort(comm);
  });
  const bool running = ready.waitAll(2, std::chrono::seconds(120));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // both are inside an allreduce
  shell("ip link set " + std::string(env("ECCL_RDMA_VM_NETDEV2")) + " down");
  auto outcomes = group.wait(std::chrono::seconds(90));
  unsetenv("ECCL_TIMEOUT_MS");
  ASSERT_TRUE(running) << "the ranks did not both finish a first allreduce\n" << describe(outcomes);
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

}  // namespace
}  // namespace eccl::test
