// Level 1: ranks as threads of one process, each with its own communicator
// over real loopback sockets.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

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
    checkEveryTypeAndOp(comm, 37);     // tree
    checkEveryTypeAndOp(comm, 300000);  // ring: past the 256 KiB crossover for every type
  });
}

// Send and receive buffers that overlap without being in place are the
// caller's error on every rank (ecclInvalidArgument, naming both); the
// communicator goes on (in place itself: checkEveryCollective). Broadcast
// and reduce check at their root only, so they are tried at one rank.
TEST_P(Threads, OverlappingBuffersAreRefusedExceptInPlace) {
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  runThreads(GetParam(), [](int rank, ecclComm_t comm) {
    int n = 0;
    ASSERT_EQ(ecclCommCount(comm, &n), ecclSuccess);
    const size_t count = 64;
    std::vector<float> buf(count * (n + 1), 1.0f);
    auto refused = [&](ecclResult_t r, const char* what) {
      EXPECT_EQ(r, ecclInvalidArgument) << what;
      EXPECT_NE(std::string(ecclGetLastError(comm)).find("overlap"), std::string::npos)
          << what << ": " << ecclGetLastError(comm);
    };
    float* b = buf.data();
    refused(ecclAllReduce(b, b + 1, count, ecclFloat32, ecclSum, comm, nullptr), "allreduce");
    refused(ecclAllGather(b + 1, b, count, ecclFloat32, comm, nullptr), "allgather");
    refused(ecclReduceScatter(b, b + 1, count, ecclFloat32, ecclSum, comm, nullptr), "reducescatter");
    refused(ecclAllToAll(b, b + 1, count / n, ecclFloat32, comm, nullptr), "alltoall");
    if (n == 1) {
      refused(ecclBroadcast(b + 3, b, count, ecclFloat32, 0, comm, nullptr), "broadcast");
      refused(ecclReduce(b, b + 3, count, ecclFloat32, ecclSum, 0, comm, nullptr), "reduce");
    }
    // Nothing was sent: the next calls match on every rank.
    std::vector<float> out(count);
    ASSERT_EQ(ecclAllReduce(b, out.data(), count, ecclFloat32, ecclSum, comm, nullptr), ecclSuccess)
        << ecclGetLastError(comm);
    EXPECT_EQ(out[count - 1], float(n));
    ASSERT_EQ(ecclAllReduce(b, b, count, ecclFloat32, ecclSum, comm, nullptr), ecclSuccess);
    EXPECT_EQ(b[0], float(n));
    (void)rank;
  });
}

// One rank refuses its part of a collective (its own arguments fail a
// check) while the others' are fine: the refuser gets ecclInvalidArgument,
// every other rank's part fails naming the refuser and why (never a
// timeout; success only for a part of sends only, done before the word
// came), and every rank's next call matches, inside a group too.
TEST(Refusal, ARankThatRefusesItsPartIsNamedEverywhereAndTheNextCallsMatch) {
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  setenv("ECCL_TIMEOUT_MS", "20000", 1);  // a refusal not heard of would show as a wait this long
  for (int n = 2; n <= 4; ++n) runThreads(n, [n](int rank, ecclComm_t comm) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    const size_t count = 256;
    std::vector<float> buf(count * (n + 1), 1.0f), out(count * n);
    float* b = buf.data();
    // Case k: rank k % n refuses; the others call with good arguments.
    // A part that is sends only (a broadcast's root, a reduce's ranks other
    // than its root) may be done before the word comes.
    // mayCarry: some rank's part is sends only.
    auto check = [&](int k, const char* what, ecclResult_t r, bool sendsOnly = false, bool mayCarry = false) {
      const int refuser = k % n;
      const std::string why = r == ecclSuccess ? "success" : ecclGetLastError(comm);
      if (sendsOnly && r == ecclSuccess && rank != refuser) {
      } else if (rank == refuser) {
        EXPECT_EQ(r, ecclInvalidArgument) << what << " at the refuser: " << why;
      } else {
        EXPECT_EQ(r, ecclInvalidUsage) << what << ": " << why;
        EXPECT_NE(why.find("rank " + std::to_string(refuser) + " refused its part"), std::string::npos)
            << what << ": " << why;
      }
      // A sends-only part that completed before the word came carries it
      // into the next call it starts (refused there, at every rank), so
      // one or two of the three calls after it may fail, naming it; the
      // last one is clean.
      int refusedAfter = 0;
      for (int call = 0; call < 3; ++call) {
        std::vector<float> one(count, float(rank + 1)), sum(count);
        ecclResult_t after = ecclAllReduce(one.data(), sum.data(), count, ecclFloat32, ecclSum, comm, nullptr);
        const std::string afterWhy = after == ecclSuccess ? "" : ecclGetLastError(comm);
        if (after != ecclSuccess && mayCarry && call < 2) {
          refusedAfter++;
          EXPECT_NE(afterWhy.find("had completed when it heard: rank " + std::to_string(refuser) + " refused its part"),
                    std::string::npos)
              << "the call after " << what << ": " << afterWhy;
          continue;
        }
        ASSERT_EQ(after, ecclSuccess) << "call " << call << " after " << what << ": " << afterWhy;
        EXPECT_EQ(sum[count - 1], float(n * (n + 1) / 2)) << "the call after " << what;
      }
      EXPECT_LE(refusedAfter, 2) << what;
    };
    const auto t0 = std::chrono::steady_clock::now();
    check(0, "allreduce with overlapping buffers",
          rank == 0 ? ecclAllReduce(b, b + 1, count, ecclFloat32, ecclSum, comm, nullptr)
                    : ecclAllReduce(b, out.data(), count, ecclFloat32, ecclSum, comm, nullptr));
    // At up to 4 ranks a 1 KiB broadcast takes a binomial tree from root 0:
    // a rank whose ancestors do not include the refuser gets its data and
    // may finish before the word comes, as the root may.
    auto hearsFromRefuser = [](int v, int refuser) {
      for (; v != 0; v &= v - 1)  // parent: the lowest set bit cleared
        if ((v & (v - 1)) == refuser) return true;
      return false;
    };
    check(1, "broadcast with a NULL receive buffer off the root",
          ecclBroadcast(b, rank == 1 % n ? nullptr : out.data(), count, ecclFloat32, 0, comm, nullptr),
          rank == 0 || !hearsFromRefuser(rank, 1 % n), true);
    check(2, "reduce with an invalid op",
          ecclReduce(b, out.data(), count, ecclFloat32, rank == 2 % n ? ecclRedOp_t(99) : ecclSum, 0, comm,
                     nullptr),
          rank != 0, true);
    check(3, "allgather with overlapping buffers",
          ecclAllGather(rank == 3 % n ? out.data() + 1 : b, out.data(), count, ecclFloat32, comm, nullptr));
    // In a group: the first call goes, the second is refused at its place.
    ASSERT_EQ(ecclGroupStart(), ecclSuccess);
    std::vector<float> first(count, 1.0f);
    ecclResult_t a = ecclAllReduce(first.data(), first.data(), count, ecclFloat32, ecclSum, comm, nullptr);
    ecclResult_t r = rank == 0 ? ecclAllReduce(b, b + 1, count, ecclFloat32, ecclSum, comm, nullptr)
                               : ecclAllReduce(b, out.data(), count, ecclFloat32, ecclSum, comm, nullptr);
    ecclResult_t end = ecclGroupEnd();
    EXPECT_EQ(a, ecclSuccess);
    if (rank == 0) {
      EXPECT_EQ(r, ecclInvalidArgument) << ecclGetLastError(comm);
      EXPECT_EQ(end, ecclSuccess) << ecclGetLastError(comm);
    } else {
      EXPECT_EQ(end, ecclInvalidUsage) << "a group whose second allreduce rank 0 refused";
      EXPECT_NE(std::string(ecclGetLastError(comm)).find("rank 0 refused its part"), std::string::npos)
          << ecclGetLastError(comm);
    }
    EXPECT_EQ(first[0], float(n)) << "the group's first allreduce";
    std::vector<float> one(count, 1.0f);
    ASSERT_EQ(ecclAllReduce(one.data(), one.data(), count, ecclFloat32, ecclSum, comm, nullptr), ecclSuccess)
        << ecclGetLastError(comm);
    EXPECT_EQ(one[0], float(n));
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15)) << "somebody waited for a refusal";
  });
  unsetenv("ECCL_TIMEOUT_MS");
}

// A broadcast's root and a leaf finish their parts before rank 2's
// refusal of it reaches them: each carries the word into its next call,
// which every rank then fails naming it; the call after that is clean.
TEST(Refusal, APartDoneBeforeTheWordCameFailsTheNextCallEverywhere) {
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  setenv("ECCL_TIMEOUT_MS", "20000", 1);
  runThreads(3, [](int rank, ecclComm_t comm) {
    const size_t count = 64;
    std::vector<float> data(count, 7.0f), out(count, 0.0f);
    if (rank == 2) std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the others are done by then
    ecclResult_t r = ecclBroadcast(data.data(), rank == 2 ? nullptr : out.data(), count, ecclFloat32, 0, comm, nullptr);
    if (rank == 2) {
      EXPECT_EQ(r, ecclInvalidArgument) << ecclGetLastError(comm);
    } else {
      ASSERT_EQ(r, ecclSuccess) << "rank " << rank << ": " << ecclGetLastError(comm);
      EXPECT_EQ(out[count - 1], 7.0f);
      std::this_thread::sleep_for(std::chrono::milliseconds(600));  // the word comes before the next call
    }
    std::vector<float> one(count, 1.0f);
    r = ecclAllReduce(one.data(), one.data(), count, ecclFloat32, ecclSum, comm, nullptr);
    const std::string why = r == ecclSuccess ? "success" : ecclGetLastError(comm);
    EXPECT_EQ(r, ecclInvalidUsage) << "rank " << rank << ": " << why;
    EXPECT_NE(why.find("op 1 (epoch 1) had completed when it heard: rank 2 refused its part of collective op 1"),
              std::string::npos)
        << "rank " << rank << ": " << why;
    std::fill(one.begin(), one.end(), 1.0f);
    ASSERT_EQ(ecclAllReduce(one.data(), one.data(), count, ecclFloat32, ecclSum, comm, nullptr), ecclSuccess)
        << "rank " << rank << ": " << ecclGetLastError(comm);
    EXPECT_EQ(one[0], 3.0f);
  });
  unsetenv("ECCL_TIMEOUT_MS");
}

// Up to 4 KiB at 3 and 4 ranks broadcast and reduce take binomial trees
// and allgather (4 ranks) recursive doubling; above, the chains and the
// ring. Every root, both sides of the bound, in place and out of place.
TEST_P(Threads, LatencyTreesAtEveryRootMatchTheChains) {
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  runThreads(GetParam(), [](int rank, ecclComm_t comm) {
    int n = 0;
    ASSERT_EQ(ecclCommCount(comm, &n), ecclSuccess);
    for (size_t count : {size_t(1), size_t(5), size_t(1024 / 2), size_t(1024), size_t(1025), size_t(3000)}) {
      for (bool inPlace : {false, true}) {
        const std::string where = " count " + std::to_string(count) + (inPlace ? " in place" : "") + " rank " +
                                  std::to_string(rank) + " of " + std::to_string(n);
        for (int root = 0; root < n; ++root) {
          std::vector<int32_t> buf(count), in(count);
          for (size_t i = 0; i < count; ++i) buf[i] = rank == root ? int32_t(i * 7 + root) : -1;
          ASSERT_EQ(ecclBroadcast(buf.data(), buf.data(), count, ecclInt32, root, comm, nullptr), ecclSuccess) << where;
          for (size_t i = 0; i < count; ++i) ASSERT_EQ(buf[i], int32_t(i * 7 + root)) << "broadcast root " << root << where;
          for (size_t i = 0; i < count; ++i) in[i] = int32_t(i + 1000 * rank);
          std::vector<int32_t> out(count, -5);
          int32_t* dst = inPlace ? in.data() : out.data();
          ASSERT_EQ(ecclReduce(in.data(), dst, count, ecclInt32, ecclSum, root, comm, nullptr), ecclSuccess) << where;
          if (rank == root)
            for (size_t i = 0; i < count; ++i)
              ASSERT_EQ(dst[i], int32_t(n * i + 1000 * (n * (n - 1) / 2))) << "reduce root " << root << where;
        }
        std::vector<int32_t> all(count * n, -3);
        for (size_t i = 0; i < count; ++i) all[rank * count + i] = int32_t(i * 11 + rank);
        std::vector<int32_t> mine(all.begin() + rank * count, all.begin() + (rank + 1) * count);
        const int32_t* src = inPlace ? all.data() + rank * count : mine.data();
        ASSERT_EQ(ecclAllGather(src, all.data(), count, ecclInt32, comm, nullptr), ecclSuccess) << where;
        for (int r = 0; r < n; ++r)
          for (size_t i = 0; i < count; ++i) ASSERT_EQ(all[r * count + i], int32_t(i * 11 + r)) << "allgather from " << r << where;
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, Threads, ::testing::Values(1, 2, 3, 4));

// Seven ranks fill two tree levels and part of a third; 40000 floats take
// three tree segments. Recursive doubling's partners are not connected at
// init, so this also runs its first-use connections.
TEST(Threads, SmallAllreduceByEveryLatencyAlgorithmAtSevenRanks) {
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  for (const char* algo : {"tree", "doubling", "halving"}) {
    SCOPED_TRACE(algo);
    setenv("ECCL_ALLREDUCE_SMALL_ALGO", algo, 1);
    runThreads(7, [](int, ecclComm_t comm) {
      checkEveryTypeAndOp(comm, 5);
      for (bool inPlace : {false, true}) checkEveryCollective(comm, 40000, inPlace);
    });
  }
  unsetenv("ECCL_ALLREDUCE_SMALL_ALGO");
}

// Halving and doubling splits the vector into one block per virtual rank:
// counts below the rank count leave blocks empty, odd counts uneven ones,
// and 3, 5 and 6 ranks fold their extra ranks in first.
TEST(Threads, HalvingDoublingAllreduceWithEmptyAndUnevenBlocks) {
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  setenv("ECCL_ALLREDUCE_SMALL_ALGO", "halving", 1);
  for (int n : {2, 3, 4, 5, 6}) {
    SCOPED_TRACE(n);
    runThreads(n, [](int, ecclComm_t comm) {
      checkEveryTypeAndOp(comm, 3);
      for (size_t count : {size_t(1), size_t(7), size_t(40001)})
        for (bool inPlace : {false, true}) checkEveryCollective(comm, count, inPlace);
    });
  }
  unsetenv("ECCL_ALLREDUCE_SMALL_ALGO");
}

// Tiny ring segments make the reduce-scatter and the all-gather overlap
// over many segments (each reduced segment of a rank's own block goes out
// at once, while later ones are still arriving), in place and out of place,
// with uneven blocks.
TEST(Threads, RingAllreduceOverlapsItsHalvesOverManySegments) {
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  setenv("ECCL_RING_SEGMENT_BYTES", "4096", 1);
  setenv("ECCL_ALLREDUCE_SMALL_BYTES", "0", 1);
  for (int n : {2, 3, 5}) {
    SCOPED_TRACE(n);
    runThreads(n, [](int, ecclComm_t comm) {
      for (size_t count : {size_t(1), size_t(1023), size_t(100003)})
        for (bool inPlace : {false, true}) checkEveryCollective(comm, count, inPlace);
    });
  }
  unsetenv("ECCL_RING_SEGMENT_BYTES");
  unsetenv("ECCL_ALLREDUCE_SMALL_BYTES");
}

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

// A rank that finishes first and destroys its communicator must not take
// with it the messages it already sent: the slower peer still receives them.
TEST(Threads, MessagesSentBeforeAPeerLeavesStayReceivable) {
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  runThreads(2, [](int rank, ecclComm_t comm) {
    std::vector<int32_t> small(5), large(300000);
    if (rank == 0) {
      for (size_t i = 0; i < large.size(); ++i) large[i] = static_cast<int32_t>(i * 3);
      small = {1, 2, 3, 4, 5};
      RANK_OK(ecclSend(small.data(), small.size(), ecclInt32, 1, comm, nullptr), comm);
      RANK_OK(ecclSend(large.data(), large.size(), ecclInt32, 1, comm, nullptr), comm);
      return;  // destroyed at once, before rank 1 posts its receives
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    RANK_OK(ecclRecv(small.data(), small.size(), ecclInt32, 0, comm, nullptr), comm);
    RANK_OK(ecclRecv(large.data(), large.size(), ecclInt32, 0, comm, nullptr), comm);
    RANK_CHECK(small[4] == 5, "small message lost");
    for (size_t i = 0; i < large.size(); ++i) RANK_CHECK(large[i] == static_cast<int32_t>(i * 3), "element mismatch");
    // Nothing more can come from a member that left: a clear error, not a hang.
    ecclResult_t rc = ecclRecv(small.data(), 1, ecclInt32, 0, comm, nullptr);
    RANK_CHECK(rc == ecclRemoteError, "receive from a departed peer returned " + std::to_string(rc));
  });
}

}  // namespace
}  // namespace eccl::test
