// Level 2 elastic membership: real processes, a real coordinator (in the
// fork helper's root process), SIGKILL and SIGSTOP. Survivors see an error
// naming the failed rank, recover with a standby or by shrinking, and the
// next collectives are exact; only the failed member's connections change.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <thread>
#include <vector>

#include "coll/algorithms.h"
#include "tests/support/elastic.h"

namespace eccl::test {
namespace {

constexpr int kLanes = kElasticLanes;
using Elastic = ElasticTest;

// Runs allreduces until one fails; returns its message.
std::string allreduceUntilFailure(ecclComm_t comm) {
  std::vector<float> v(4096, 1.0f);
  for (int i = 0; i < 100000; ++i) {
    ecclResult_t r = ecclAllReduce(v.data(), v.data(), v.size(), ecclFloat32, ecclSum, comm, nullptr);
    if (r != ecclSuccess) {
      RANK_CHECK(r == ecclRemoteError || r == ecclTimeout, std::string("unexpected ") + ecclGetErrorString(r));
      return ecclGetLastError(comm);
    }
  }
  throw std::runtime_error("no failure seen");
}

// At 5 ranks rank 2 is a tree leaf (three partners); at 16 it has a
// parent, two children and two ring neighbours. Either way its joiner
// opens lanes to those partners only, not to the other ranks.
class ElasticSizes : public ElasticTest, public ::testing::WithParamInterface<int> {};

TEST_P(ElasticSizes, StandbyReplacesAKilledRankTouchingOnlyItsConnections) {
  const int n = GetParam(), victim = 2;
  ProcessGroup group(n + 1, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    if (index == n) {  // the standby
      RANK_OK(ecclCommInitStandby(&comm, id, nullptr), nullptr);
      ecclCommStats_t s = statsOf(comm);
      RANK_CHECK(s.rank == victim && s.nranks == n && s.epoch == 2 && s.joinedEpoch == 2,
                 "promoted as rank " + std::to_string(s.rank) + " epoch " + std::to_string(s.epoch));
      size_t partners = coll::latencyPeers(victim, n).size();
      RANK_CHECK(s.connectionsOpened == partners * kLanes && partners == (n >= 8 ? 5u : 3u),
                 "the joiner opened " + std::to_string(s.connectionsOpened) + " lanes for " + std::to_string(partners) +
                     " partners");
      checkQueuePairsFollowLanes(s);
      checkAllreduce(comm);
      RANK_OK(ecclCommDestroy(comm), comm);
      return;
    }
    RANK_OK(ecclCommInitRank(&comm, n, id, index), nullptr);
    checkAllreduce(comm);
    if (index == victim) dieSoon();
    std::string why = allreduceUntilFailure(comm);
    RANK_CHECK(why.find("rank 2") != std::string::npos, "error does not name rank 2: " + why);
    ecclCommStats_t before = statsOf(comm);
    RANK_OK(ecclCommRecover(comm, ecclRecoverReplace), comm);
    ecclCommStats_t s = statsOf(comm);
    int rank, count;
    RANK_OK(ecclCommUserRank(comm, &rank), comm);
    RANK_OK(ecclCommCount(comm, &count), comm);
    RANK_CHECK(rank == index && count == n, "renumbered by a replace");
    RANK_CHECK(s.epoch == 2 && s.reconfigurations == 1, "epoch " + std::to_string(s.epoch));
    // The delta: only lanes to the failed member close (if still open) and
    // only the ranks whose algorithms use rank 2 open lanes, to the joiner.
    auto peers = coll::latencyPeers(index, n);
    bool usesVictim = std::count(peers.begin(), peers.end(), victim) > 0;
    RANK_CHECK(s.connectionsClosed <= kLanes, "closed " + std::to_string(s.connectionsClosed));
    RANK_CHECK(s.connectionsOpened == (usesVictim ? kLanes : 0u), "opened " + std::to_string(s.connectionsOpened));
    RANK_CHECK(s.connectionsInherited + s.connectionsClosed >= before.openConnections - kLanes,
               "inherited " + std::to_string(s.connectionsInherited));
    checkQueuePairsFollowLanes(s);
    checkAllreduce(comm);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  expectOnlyVictimsDied(outcomes, {victim});
}

INSTANTIATE_TEST_SUITE_P(Ranks, ElasticSizes, ::testing::Values(5, 16));

TEST_F(Elastic, ShrinkRenumbersDenselyAndReplaceWithoutStandbyIsAClearError) {
  constexpr int n = 4, victim = 1;
  ProcessGroup group(n, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, n, id, index), nullptr);
    checkAllreduce(comm);
    if (index == victim) dieSoon();
    allreduceUntilFailure(comm);
    ecclResult_t r = ecclCommRecover(comm, ecclRecoverReplace);
    std::string why = ecclGetLastError(comm);
    RANK_CHECK(r != ecclSuccess && why.find("standby") != std::string::npos, "replace without standby: " + why);
    RANK_OK(ecclCommRecover(comm, ecclRecoverShrink), comm);
    int rank, count;
    RANK_OK(ecclCommUserRank(comm, &rank), comm);
    RANK_OK(ecclCommCount(comm, &count), comm);
    RANK_CHECK(count == n - 1 && rank == (index < victim ? index : index - 1),
               "rank " + std::to_string(rank) + " of " + std::to_string(count));
    checkAllreduce(comm);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  expectOnlyVictimsDied(outcomes, {victim});
}

// A rank whose own code failed (not a peer) may call recover like one that
// saw a failure: nothing failed, so its calls must go on in the same epoch
// with the ranks that never called it, not start their count over.
TEST_F(Elastic, RecoverWithNothingFailedLeavesTheSequenceAlone) {
  constexpr int n = 3;
  ProcessGroup group(n, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, n, id, index), nullptr);
    for (int i = 0; i < 3; ++i) checkAllreduce(comm);
    if (index != 2) {
      for (ecclRecoverPolicy_t p : {ecclRecoverShrink, ecclRecoverReplaceOrShrink}) RANK_OK(ecclCommRecover(comm, p), comm);
    }
    ecclCommStats_t s = statsOf(comm);
    RANK_CHECK(s.epoch == 1 && s.reconfigurations == 0 && s.nranks == n,
               "epoch " + std::to_string(s.epoch) + " after recovering from nothing");
    for (int i = 0; i < 3; ++i) checkAllreduce(comm);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  expectOnlyVictimsDied(outcomes, {});
}

// Logs are keyed by rank; a shrink renumbers ranks, so each survivor's
// records must follow their peer to its new rank, and the records for the
// member that left must go (nobody can ever be replayed them).
TEST_F(Elastic, ShrinkMovesBoundarySendLogsToThePeersNewRanks) {
  constexpr int n = 4, victim = 1;
  ProcessGroup group(n, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, n, id, index), nullptr);
    ecclLogConfig_t config{};
    config.size = sizeof(config);
    config.capacityBytes = 1 << 20;
    RANK_OK(ecclLogConfigure(comm, &config), comm);
    RANK_OK(ecclLogSetTag(comm, 7, 0), comm);
    // One logged int to every other rank, naming sender and receiver.
    std::vector<int32_t> out(n), in(n);
    RANK_OK(ecclGroupStart(), nullptr);
    for (int p = 0; p < n; ++p) {
      if (p == index) continue;
      out[p] = 100 * index + p;
      RANK_OK(ecclSend(&out[p], 1, ecclInt32, p, comm, nullptr), comm);
      RANK_OK(ecclRecv(&in[p], 1, ecclInt32, p, comm, nullptr), comm);
    }
    RANK_OK(ecclGroupEnd(), nullptr);
    checkAllreduce(comm);
    if (index == victim) dieSoon();
    allreduceUntilFailure(comm);
    RANK_OK(ecclCommRecover(comm, ecclRecoverShrink), comm);
    int rank, count;
    RANK_OK(ecclCommUserRank(comm, &rank), comm);
    RANK_OK(ecclCommCount(comm, &count), comm);
    RANK_CHECK(count == n - 1, "shrunk to " + std::to_string(count));
    ecclLogStats_t st{};
    st.size = sizeof(st);
    RANK_OK(ecclLogStats(comm, &st), comm);
    RANK_CHECK(st.records == static_cast<uint64_t>(n - 2),
               "records after the shrink: " + std::to_string(st.records) + " (the leaver's must go)");
    for (int p = 0; p < count; ++p) {
      if (p == rank) continue;
      int oldIndex = p < victim ? p : p + 1;
      ecclLogRecord_t rec{};
      rec.size = sizeof(rec);
      int32_t value = -1;
      RANK_OK(ecclLogRead(comm, p, 0, &rec, &value, sizeof(value)), comm);
      RANK_CHECK(rec.peer == p && value == 100 * index + oldIndex && rec.iteration == 7,
                 "record for new rank " + std::to_string(p) + " holds " + std::to_string(value) + " (peer " +
                     std::to_string(rec.peer) + ")");
    }
    checkAllreduce(comm);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  expectOnlyVictimsDied(outcomes, {victim});
}

TEST_F(Elastic, TwoFailuresWithTwoStandbysRecoverInOneStep) {
  constexpr int n = 5;
  const std::set<int> victims{1, 3};
  ProcessGroup group(n + 2, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    if (index >= n) {
      RANK_OK(ecclCommInitStandby(&comm, id, nullptr), nullptr);
      ecclCommStats_t s = statsOf(comm);
      RANK_CHECK(victims.count(s.rank) && s.epoch == 2, "standby became rank " + std::to_string(s.rank));
      checkAllreduce(comm);
      RANK_OK(ecclCommDestroy(comm), comm);
      return;
    }
    RANK_OK(ecclCommInitRank(&comm, n, id, index), nullptr);
    checkAllreduce(comm);
    if (victims.count(index)) dieSoon();
    allreduceUntilFailure(comm);
    // Give the second failure time to be declared, so both are in one view change.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    RANK_OK(ecclCommRecover(comm, ecclRecoverReplace), comm);
    RANK_CHECK(statsOf(comm).epoch == 2, "more than one step: epoch " + std::to_string(statsOf(comm).epoch));
    checkAllreduce(comm);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  expectOnlyVictimsDied(outcomes, victims);
}

TEST_F(Elastic, ReplaceOrShrinkReplacesWhileStandbysLastThenShrinks) {
  constexpr int n = 5;
  const std::set<int> victims{1, 3};
  ProcessGroup group(n + 1, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    if (index == n) {
      RANK_OK(ecclCommInitStandby(&comm, id, nullptr), nullptr);
      ecclCommStats_t s = statsOf(comm);
      RANK_CHECK(s.rank == 1 && s.nranks == n - 1, "the standby took rank " + std::to_string(s.rank));
      checkAllreduce(comm);
      RANK_OK(ecclCommDestroy(comm), comm);
      return;
    }
    RANK_OK(ecclCommInitRank(&comm, n, id, index), nullptr);
    checkAllreduce(comm);
    if (victims.count(index)) dieSoon();
    allreduceUntilFailure(comm);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // both failures declared
    RANK_OK(ecclCommRecover(comm, ecclRecoverReplaceOrShrink), comm);
    int rank, count;
    RANK_OK(ecclCommUserRank(comm, &rank), comm);
    RANK_OK(ecclCommCount(comm, &count), comm);
    // Rank 1 is replaced by the one standby; rank 3 is dropped and rank 4
    // becomes rank 3.
    RANK_CHECK(count == n - 1 && rank == (index == 4 ? 3 : index), "rank " + std::to_string(rank));
    checkAllreduce(comm);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  expectOnlyVictimsDied(outcomes, victims);
}

TEST_F(Elastic, AStoppedMemberIsFencedAndNeverSilentlyReadmitted) {
  constexpr int n = 3, victim = 2;
  setenv("ECCL_HEARTBEAT_TIMEOUT_MS", "1000", 1);  // the 3 s stop must be taken for a failure
  ReadyFiles ready;
  ProcessGroup group(n, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, n, id, index), nullptr);
    checkAllreduce(comm);
    ReadyFiles::mark(ready.dir, index);
    if (index == victim) {
      // The parent stops us here and continues us after the others shrank.
      std::this_thread::sleep_for(std::chrono::seconds(4));
      std::vector<float> v(16, 1.0f);
      ecclResult_t r = ecclAllReduce(v.data(), v.data(), v.size(), ecclFloat32, ecclSum, comm, nullptr);
      RANK_CHECK(r != ecclSuccess, "a fenced member completed an allreduce");
      ecclResult_t async = ecclSuccess;
      for (int i = 0; i < 50 && async != ecclEvicted; ++i) {
        ecclCommGetAsyncError(comm, &async);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      RANK_CHECK(async == ecclEvicted, std::string("async error is ") + ecclGetErrorString(async));
      RANK_CHECK(ecclCommRecover(comm, ecclRecoverShrink) == ecclEvicted, "a fenced member recovered");
      ecclCommAbort(comm);
      return;
    }
    std::string why = allreduceUntilFailure(comm);
    RANK_CHECK(why.find("rank 2") != std::string::npos, "error does not name rank 2: " + why);
    RANK_OK(ecclCommRecover(comm, ecclRecoverShrink), comm);
    checkAllreduce(comm);
    RANK_OK(ecclBarrier(comm), comm);
    std::this_thread::sleep_for(std::chrono::seconds(3));  // the fenced member wakes meanwhile
    checkAllreduce(comm);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  const bool running = ready.waitAll(n, std::chrono::seconds(60));
  group.signal(victim, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));
  group.signal(victim, SIGCONT);
  auto outcomes = group.wait(std::chrono::seconds(60));
  ASSERT_TRUE(running) << "the ranks did not all finish a first allreduce\n" << describe(outcomes);
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

}  // namespace
}  // namespace eccl::test
