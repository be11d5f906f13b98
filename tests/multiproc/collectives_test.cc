// Level 2: real processes. Every collective x counts x rank counts x
// in-place/out-of-place, checked element-wise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "tests/support/collectives.h"
#include "tests/support/multiproc.h"

namespace eccl::test {
namespace {

class Processes : public ::testing::TestWithParam<int> {};

TEST_P(Processes, EveryCollectiveEveryCount) {
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  ProcessGroup group(GetParam(), [](int rank, int n, const ecclUniqueId& id) {
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, n, id, rank), nullptr);
    // 0, 1, primes, a count not divisible by any rank count here, and 32 MiB
    // of float, 64 ring segments. Where the link is emulated (the Soft-RoCE
    // VM) ECCL_TEST_LARGEST_COUNT lowers the last, and the uneven count
    // stays below it: still many zero-copy chunks, in a fraction of the time.
    const char* largest = getenv("ECCL_TEST_LARGEST_COUNT");
    const size_t last = largest ? std::strtoull(largest, nullptr, 10) : size_t(8) << 20;
    size_t uneven = std::min<size_t>(1000003, last > 8 ? last - 1 : 1);
    while (uneven > 1 && (uneven % 2 == 0 || uneven % 3 == 0 || uneven % 5 == 0)) --uneven;
    for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(8191), uneven, last})
      for (bool inPlace : {false, true}) checkEveryCollective(comm, count, inPlace);
    checkEveryTypeAndOp(comm, 101);
    RANK_OK(ecclCommDestroy(comm), nullptr);
  });
  auto outcomes = group.wait(std::chrono::seconds(240));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

INSTANTIATE_TEST_SUITE_P(Ranks, Processes, ::testing::Values(2, 3, 4, 5));

}  // namespace
}  // namespace eccl::test
