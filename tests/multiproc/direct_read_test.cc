// Same-host collectives that read the peers' buffers where they lie
// (ECCL_SHM_DIRECT_BYTES, coll/direct.h): allreduce gives every rank the
// sums in rank order ((x0 + x1) + x2 ...) bit for bit, in place and out of
// place, with uneven blocks, in every type and op; broadcast, all-gather
// and reduce-scatter give the lanes' results, both placements; TCP lanes,
// ECCL_SHM_DIRECT_BYTES=0 and a rank that may not read its peers
// (ECCL_SHM_PEER_READS=0) keep the lanes at every rank, with the same
// sums. A rank killed or stopped inside it: faults_test's FaultsAtASize/Large.
#include <gtest/gtest.h>

#include <signal.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/collectives.h"
#include "tests/support/elastic.h"
#include "tests/support/multiproc.h"

namespace eccl::test {
namespace {

bool overSharedMemory() {
  const char* t = getenv("ECCL_TRANSPORT");
  return !t || std::string(t) != "tcp";
}

std::vector<float> inputOf(int rank, size_t count) {
  std::mt19937 gen(1234 + rank);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(count);
  for (float& x : v) x = d(gen);
  return v;
}

// Random floats. Read in place they are summed in rank order: the
// expected bits, computed here; the lanes' ring sums in another order.
void checkSums(ecclComm_t comm, int rank, int n, size_t count, bool inPlace, bool rankOrder) {
  std::vector<float> in = inputOf(rank, count), out(count, -7.0f);
  float* result = inPlace ? in.data() : out.data();
  RANK_OK(ecclAllReduce(in.data(), result, count, ecclFloat32, ecclSum, comm, nullptr), comm);
  std::vector<float> want = inputOf(0, count);
  for (int r = 1; r < n; ++r) {
    std::vector<float> next = inputOf(r, count);
    for (size_t i = 0; i < count; ++i) want[i] += next[i];
  }
  for (size_t i = 0; i < count; ++i)
    RANK_CHECK(rankOrder ? std::memcmp(&result[i], &want[i], sizeof(float)) == 0
                         : std::fabs(result[i] - want[i]) <= 1e-5f,
               "count " + std::to_string(count) + (inPlace ? " in place" : "") + ": element " + std::to_string(i) +
                   " is " + std::to_string(result[i]) + ", the rank-order sum " + std::to_string(want[i]));
}

// What each job expects of the direct path: taken, or kept off at every rank.
enum class Expect { kDirect, kLanes };

ProcessGroup::Body directJob(Expect expect, int refusingRank) {
  return [expect, refusingRank](int rank, int n, const ecclUniqueId& id) {
    if (rank == refusingRank) setenv("ECCL_SHM_PEER_READS", "0", 1);
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, n, id, rank), nullptr);
    // From the 2-rank threshold (128 KiB) up; blocks uneven (a prime), and
    // 8 MiB (many cache-sized pieces per block).
    for (size_t count : {size_t(32768), size_t(1000003), size_t(2) << 20})
      for (bool inPlace : {false, true}) checkSums(comm, rank, n, count, inPlace, expect == Expect::kDirect);
    checkEveryTypeAndOp(comm, 140000);  // int8 at 2 ranks too
    for (bool inPlace : {false, true}) checkEveryCollective(comm, 1000003, inPlace);  // broadcast, gathers, scatters
    const ecclCommStats_t s = statsOf(comm);
    const std::string seen = "direct allreduces " + std::to_string(s.directCollectives) + ", peer bytes read " +
                             std::to_string(s.peerBytesRead) + ", readable lanes " + std::to_string(s.peerReadLanes);
    if (expect == Expect::kDirect) {
      RANK_CHECK(s.directCollectives >= uint64_t(6 + int(ecclNumTypes) * int(ecclNumOps) + 2 * 4) && s.peerBytesRead > 0 && s.peerReadLanes >= uint64_t(n - 1),
                 seen);
    } else {
      RANK_CHECK(s.directCollectives == 0 && s.peerBytesRead == 0, seen);
      if (rank == refusingRank) RANK_CHECK(s.peerReadLanes == 0, seen);
    }
    RANK_OK(ecclCommDestroy(comm), nullptr);
  };
}

class DirectRanks : public ::testing::TestWithParam<int> {};

TEST_P(DirectRanks, AllreduceReadsThePeersInPlaceWithRankOrderSums) {
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  ProcessGroup group(GetParam(), directJob(overSharedMemory() ? Expect::kDirect : Expect::kLanes, -1));
  auto outcomes = group.wait(std::chrono::seconds(240));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

TEST_P(DirectRanks, ASizeOfZeroKeepsTheLanes) {
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  setenv("ECCL_SHM_DIRECT_BYTES", "0", 1);
  ProcessGroup group(GetParam(), directJob(Expect::kLanes, -1));
  auto outcomes = group.wait(std::chrono::seconds(240));
  unsetenv("ECCL_SHM_DIRECT_BYTES");
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

// The last rank may not read: it says so in the first round, and every
// rank runs the ring for that op and the rest of the view.
TEST_P(DirectRanks, ARankThatMayNotReadKeepsEveryRankOnTheLanes) {
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  ProcessGroup group(GetParam(), directJob(Expect::kLanes, GetParam() - 1));
  auto outcomes = group.wait(std::chrono::seconds(240));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

INSTANTIATE_TEST_SUITE_P(Ranks, DirectRanks, ::testing::Values(2, 3, 4));

// A standby replaces a killed rank: the survivors and the joiner (a new
// process, a new lane, a new probe) read each other in place at once, with
// rank-order bits, and the killed rank's failure was named.
TEST(DirectReplace, AJoinerIsReadInPlaceAfterItReplacesAKilledRank) {
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  setenv("ECCL_HEARTBEAT_MS", "100", 1);
  constexpr int n = 3, victim = 1;
  const bool shm = overSharedMemory();
  ProcessGroup group(n + 1, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    if (index == n) {  // the standby
      RANK_OK(ecclCommInitStandby(&comm, id, nullptr), nullptr);
      checkSums(comm, victim, n, 1000003, false, shm);
      const ecclCommStats_t s = statsOf(comm);
      RANK_CHECK(shm ? s.directCollectives == 1 && s.peerReadLanes >= uint64_t(n - 1) : s.directCollectives == 0,
                 "the joiner read in place " + std::to_string(s.directCollectives) + " times over " +
                     std::to_string(s.peerReadLanes) + " lanes");
      RANK_OK(ecclCommDestroy(comm), comm);
      return;
    }
    RANK_OK(ecclCommInitRank(&comm, n, id, index), nullptr);
    checkSums(comm, index, n, 1000003, false, shm);
    if (index == victim) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      raise(SIGKILL);
    }
    std::vector<float> v(1000003, 1.0f);
    ecclResult_t r = ecclSuccess;
    for (int i = 0; i < 100000 && r == ecclSuccess; ++i)
      r = ecclAllReduce(v.data(), v.data(), v.size(), ecclFloat32, ecclSum, comm, nullptr);
    RANK_CHECK(r != ecclSuccess && std::string(ecclGetLastError(comm)).find("rank 1") != std::string::npos,
               std::string("the failure does not name rank 1: ") + ecclGetLastError(comm));
    RANK_OK(ecclCommRecover(comm, ecclRecoverReplace), comm);
    const uint64_t before = statsOf(comm).directCollectives;
    checkSums(comm, index, n, 1000003, false, shm);
    RANK_CHECK(statsOf(comm).directCollectives == before + (shm ? 1 : 0), "after the replacement");
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(120));
  unsetenv("ECCL_HEARTBEAT_MS");
  for (const auto& o : outcomes) {
    if (o.rank == victim) continue;
    EXPECT_TRUE(o.exited && o.exitCode == 0) << describe(outcomes);
  }
}

// The first collective after a switchover opens no lane although it reads
// every peer in place: the preparation opened the joiner's lane to every
// member (at 6 ranks the ring and tree alone would use only some of them).
void firstCollectiveOpensNothing(ecclComm_t comm, int rank, int n, bool shm, const std::string& who) {
  const ecclCommStats_t before = statsOf(comm);
  checkSums(comm, rank, n, 1000003, false, shm);
  const ecclCommStats_t after = statsOf(comm);
  RANK_CHECK(after.connectionsOpenedEver == before.connectionsOpenedEver,
             who + "'s first collective after the switchover opened " +
                 std::to_string(after.connectionsOpenedEver - before.connectionsOpenedEver) + " lanes");
  RANK_CHECK(after.directCollectives == before.directCollectives + (shm ? 1 : 0),
             who + " read in place " + std::to_string(after.directCollectives - before.directCollectives) + " times");
}

TEST(DirectMigrate, ThePreparationOpensEveryLaneTheJoinerReadsOver) {
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  constexpr int n = 6, leaver = 2;
  const bool shm = overSharedMemory();
  ProcessGroup group(n + 1, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    if (index == n) {  // the joiner
      RANK_OK(ecclCommInitStandby(&comm, id, nullptr), nullptr);
      RANK_OK(ecclCommSwitchover(comm), comm);
      firstCollectiveOpensNothing(comm, leaver, n, shm, "the joiner");
      RANK_OK(ecclCommDestroy(comm), comm);
      return;
    }
    RANK_OK(ecclCommInitRank(&comm, n, id, index), nullptr);
    checkSums(comm, index, n, 1000003, false, shm);  // every pair's lanes among the members
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the standby registered
    if (index == 0) RANK_OK(ecclCommPrepare(comm, leaver), comm);
    awaitEveryoneReady(comm);
    RANK_OK(ecclCommSwitchover(comm), comm);
    if (index != leaver) firstCollectiveOpensNothing(comm, index, n, shm, "rank " + std::to_string(index));
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(120));
  for (const auto& o : outcomes) EXPECT_TRUE(o.exited && o.exitCode == 0) << describe(outcomes);
}

}  // namespace
}  // namespace eccl::test
