// Level 1: ranks as threads of one process, each with its own communicator
// over real loopback sockets.
#include <gtest/gtest.h>

#include <cstring>

#include "tests/support/collectives.h"
#include "tests/support/multiproc.h"

namespace eccl::test {
namespace {

class Threads : public ::testing::TestWithParam<int> {};

TEST_P(Threads, EveryCollectiveSmallAndRingSizes) {
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  runThreads(GetParam(), [](int, ecclComm_t comm) {
    for (size_t count : {size_t(0), size_t(1), size_t(17), size_t(70001)})
      for (bool inPlace : {false, true}) checkEveryCollective(comm, count, inPlace);
  });
}

TEST_P(Threads, EveryTypeAndOp) {
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  runThreads(GetParam(), [](int, ecclComm_t comm) {
    checkEveryTypeAndOp(comm, 37);     // recursive doubling
    checkEveryTypeAndOp(comm, 40000);  // ring (past the small-message crossover for most types)
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Threads, ::testing::Values(1, 2, 3, 4));

TEST(Threads, ResultsAreBitwiseIdenticalAcrossRanksAndRuns) {
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  std::vector<std::vector<float>> results(2 * 3);
  for (int run = 0; run < 2; ++run) {
    runThreads(3, [&](int rank, ecclComm_t comm) {
      std::vector<float> v(300001);
      for (size_t i = 0; i < v.size(); ++i) v[i] = 1.0f / static_cast<float>(rank * 7 + i % 1013 + 1);
      RANK_OK(ecclAllReduce(v.data(), v.data(), v.size(), ecclFloat32, ecclSum, comm, nullptr), comm);
      results[run * 3 + rank] = v;
    });
  }
  for (size_t k = 1; k < results.size(); ++k)
    ASSERT_EQ(0, std::memcmp(results[0].data(), results[k].data(), results[0].size() * 4)) << "result " << k;
}

}  // namespace
}  // namespace eccl::test
