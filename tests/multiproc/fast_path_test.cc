// Shared memory's small-message path (core/fast_path.h): small collectives
// go through the slots beside the lane and give the ring's results; a
// message larger than a slot, a TCP lane or ECCL_SHM_FAST_PATH_BYTES=0 keep
// the ring; the counters say which way the messages went. Failures inside
// the path are in faults_test (FaultsAtASize/Small) and signature_test.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/collectives.h"
#include "tests/support/multiproc.h"

namespace eccl::test {
namespace {

bool overSharedMemory() {
  const char* t = getenv("ECCL_TRANSPORT");
  const char* off = getenv("ECCL_SHM_FAST_PATH_BYTES");
  return (!t || std::string(t) != "tcp") && !(off && std::string(off) == "0");
}

// Runs `call` and returns how many messages it sent through the slots.
template <typename Call>
uint64_t fastSentBy(ecclComm_t comm, Call call) {
  const uint64_t before = statsOf(comm).fastMessagesSent;
  call();
  return statsOf(comm).fastMessagesSent - before;
}

void smallAndLarge(int rank, int n, const ecclUniqueId& id) {
  ecclComm_t comm;
  RANK_OK(ecclCommInitRank(&comm, n, id, rank), nullptr);
  const bool fast = overSharedMemory();
  // A slot's worth of floats goes the fast way, with the right sums.
  constexpr size_t kSlotFloats = 16384 / sizeof(float);
  std::vector<float> v(kSlotFloats);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(rank + 1) * static_cast<float>(i % 7);
  const uint64_t allreduceFast = fastSentBy(comm, [&] {
    RANK_OK(ecclAllReduce(v.data(), v.data(), v.size(), ecclFloat32, ecclSum, comm, nullptr), comm);
  });
  for (size_t i = 0; i < v.size(); ++i)
    RANK_CHECK(v[i] == static_cast<float>(n * (n + 1) / 2) * static_cast<float>(i % 7),
               "allreduce element " + std::to_string(i) + " is " + std::to_string(v[i]));
  RANK_CHECK(fast ? allreduceFast > 0 : allreduceFast == 0,
             "a 16 KiB allreduce sent " + std::to_string(allreduceFast) + " messages through the slots");
  // A broadcast sends its whole message: one float past a slot keeps the ring.
  std::vector<float> b(kSlotFloats + 1, rank == 0 ? 2.5f : 0.0f);
  const uint64_t largeFast = fastSentBy(comm, [&] {
    RANK_OK(ecclBroadcast(b.data(), b.data(), b.size(), ecclFloat32, 0, comm, nullptr), comm);
  });
  for (float x : b) RANK_CHECK(x == 2.5f, "a broadcast element is " + std::to_string(x));
  RANK_CHECK(largeFast == 0, "a 16388-byte broadcast sent " + std::to_string(largeFast) + " messages through the slots");
  const uint64_t smallFast = fastSentBy(comm, [&] {
    RANK_OK(ecclBroadcast(b.data(), b.data(), kSlotFloats, ecclFloat32, 0, comm, nullptr), comm);
  });
  RANK_CHECK(fast ? rank != 0 || smallFast > 0 : smallFast == 0,
             "a 16384-byte broadcast sent " + std::to_string(smallFast) + " messages through the slots");
  // Every collective, small counts, both placements, every type and op.
  for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(100)})
    for (bool inPlace : {false, true}) checkEveryCollective(comm, count, inPlace);
  checkEveryTypeAndOp(comm, 33);
  // A partner that comes late each time (an exchange that outlasts its
  // first polls waits the general way) and one that comes at once.
  for (int i = 0; i < 4 * n; ++i) {
    if (i % 2 == 0 && rank == (i / 2) % n) std::this_thread::sleep_for(std::chrono::milliseconds(3));
    int64_t x = rank + i;
    RANK_OK(ecclAllReduce(&x, &x, 1, ecclInt64, ecclSum, comm, nullptr), comm);
    RANK_CHECK(x == int64_t(n) * i + int64_t(n) * (n - 1) / 2, "late-partner allreduce " + std::to_string(i) +
                                                                   " gave " + std::to_string(x));
  }
  const ecclCommStats_t s = statsOf(comm);
  RANK_CHECK(fast ? s.fastMessagesReceived > 0 : s.fastMessagesSent + s.fastMessagesReceived == 0,
             "sent " + std::to_string(s.fastMessagesSent) + ", received " + std::to_string(s.fastMessagesReceived));
  RANK_CHECK(s.fastMessagesStale == 0, std::to_string(s.fastMessagesStale) + " stale messages in a job without failures");
  RANK_OK(ecclCommDestroy(comm), nullptr);
}

class FastPathRanks : public ::testing::TestWithParam<int> {};

TEST_P(FastPathRanks, SmallCollectivesTakeTheSlotsAndLargerMessagesTheRing) {
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  ProcessGroup group(GetParam(), smallAndLarge);
  auto outcomes = group.wait(std::chrono::seconds(120));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

TEST_P(FastPathRanks, ASizeOfZeroTurnsThePathOff) {
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  setenv("ECCL_SHM_FAST_PATH_BYTES", "0", 1);
  ProcessGroup group(GetParam(), smallAndLarge);
  auto outcomes = group.wait(std::chrono::seconds(120));
  unsetenv("ECCL_SHM_FAST_PATH_BYTES");
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

INSTANTIATE_TEST_SUITE_P(Ranks, FastPathRanks, ::testing::Values(2, 3, 4));

}  // namespace
}  // namespace eccl::test
