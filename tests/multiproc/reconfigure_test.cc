// Level 2 two-phase reconfiguration: expected migration with a state stream
// (prepare in the background while allreduces run, switch at a boundary,
// only the delta moves), grow, eager standbys, and failures while a
// reconfiguration is prepared or switched.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <set>
#include <thread>
#include <vector>

#include "coll/algorithms.h"
#include "tests/support/elastic.h"

namespace eccl::test {
namespace {

constexpr int kLanes = kElasticLanes;
using Reconfigure = ElasticTest;

// A rank of the current view: joins, checks an allreduce, waits for the
// standbys to register, has rank 0 prepare the migration of `leaver` and
// runs until every rank sees it READY (all at the same boundary).
void joinAndPrepare(ecclComm_t* comm, int n, const ecclUniqueId& id, int index, int leaver, int standbyWaitMs) {
  RANK_OK(ecclCommInitRank(comm, n, id, index), nullptr);
  checkAllreduce(*comm);
  std::this_thread::sleep_for(std::chrono::milliseconds(standbyWaitMs));
  if (index == 0) RANK_OK(ecclCommPrepare(*comm, leaver), *comm);
  awaitEveryoneReady(*comm);
}

// Until the eager standby's idle lanes are up next to the lanes to this
// rank's `peers` (members dial it or it dials them).
void waitForEagerStandbyLanes(ecclComm_t comm, size_t peers) {
  uint64_t want = (peers + 1) * kLanes;
  for (int i = 0; statsOf(comm).openConnections < want; ++i) {
    RANK_CHECK(i < 500, "the eager standby's lanes never came up");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::vector<uint32_t> stateOf(int seed) {
  std::vector<uint32_t> s(1 << 18);
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<uint32_t>(i * 2654435761u + seed);
  return s;
}

TEST_F(Reconfigure, ExpectedMigrationStreamsStateAndSwitchesOnlyTheDelta) {
  constexpr int n = 5, leaver = 2;
  ProcessGroup group(n + 1, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    if (index == n) {  // the joiner
      RANK_OK(ecclCommInitStandby(&comm, id, nullptr), nullptr);
      int rank;
      RANK_OK(ecclCommUserRank(comm, &rank), comm);
      RANK_CHECK(rank == leaver, "joiner is to take rank " + std::to_string(rank));
      std::vector<float> x(4);
      RANK_CHECK(ecclAllReduce(x.data(), x.data(), 4, ecclFloat32, ecclSum, comm, nullptr) == ecclInvalidUsage,
                 "a joiner ran a collective before its switchover");
      std::vector<uint32_t> state(stateOf(0).size());
      RANK_OK(ecclMigrationRecv(state.data(), state.size(), ecclUint32, comm, nullptr), comm);
      RANK_CHECK(state == stateOf(77), "the streamed state differs");
      RANK_OK(ecclCommSwitchover(comm), comm);
      ecclCommStats_t s = statsOf(comm);
      RANK_CHECK(s.rank == leaver && s.epoch == 2 && s.joinedEpoch == 2, "joiner stats");
      RANK_CHECK(s.connectionsOpened == 0, "joiner opened " + std::to_string(s.connectionsOpened) + " at switchover");
      checkQueuePairsFollowLanes(s);
      checkAllreduce(comm, 5);
      RANK_OK(ecclCommDestroy(comm), comm);
      return;
    }
    RANK_OK(ecclCommInitRank(&comm, n, id, index), nullptr);
    checkAllreduce(comm);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the standby registered
    if (index == 0 || index == leaver) RANK_OK(ecclCommPrepare(comm, leaver), comm);
    if (index == leaver) {
      std::vector<uint32_t> state = stateOf(77);
      RANK_OK(ecclMigrationSend(state.data(), state.size(), ecclUint32, comm, nullptr), comm);
    }
    awaitEveryoneReady(comm, [&](int step) { checkAllreduce(comm, step); });  // the old view keeps running
    ecclCommStats_t before = statsOf(comm);
    RANK_OK(ecclCommSwitchover(comm), comm);
    ecclCommStats_t s = statsOf(comm);
    if (index == leaver) {
      std::vector<float> x(4);
      RANK_CHECK(ecclAllReduce(x.data(), x.data(), 4, ecclFloat32, ecclSum, comm, nullptr) == ecclInvalidUsage,
                 "the leaver still runs collectives");
      RANK_CHECK(std::string(ecclGetLastError(comm)).find("left the view") != std::string::npos, ecclGetLastError(comm));
      RANK_OK(ecclCommDestroy(comm), comm);
      return;
    }
    int rank;
    RANK_OK(ecclCommUserRank(comm, &rank), comm);
    RANK_CHECK(rank == index && s.epoch == 2 && s.reconfigurations == 1, "stayer renumbered or epoch wrong");
    // The delta: the ranks whose algorithms use the leaver's rank opened
    // lanes to the joiner while preparing; nobody opened anything at the
    // switchover.
    auto peers = coll::latencyPeers(index, n);
    bool usesLeaver = std::count(peers.begin(), peers.end(), leaver) > 0;
    RANK_CHECK(s.connectionsPrepared == (usesLeaver ? kLanes : 0u), "prepared " + std::to_string(s.connectionsPrepared));
    RANK_CHECK(s.connectionsOpened == 0, "opened " + std::to_string(s.connectionsOpened) + " at switchover");
    RANK_CHECK(s.connectionsClosed <= kLanes, "closed " + std::to_string(s.connectionsClosed));
    // Only the leaver's lanes go (closed by us, or by the leaver's own
    // goodbye if it left before we applied the view); the rest is inherited.
    RANK_CHECK(s.connectionsInherited + s.connectionsClosed <= before.openConnections &&
                   s.connectionsInherited >= before.openConnections - kLanes,
               "inherited " + std::to_string(s.connectionsInherited) + " closed " + std::to_string(s.connectionsClosed) +
                   " open before " + std::to_string(before.openConnections));
    checkQueuePairsFollowLanes(s);
    checkAllreduce(comm, 5);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  expectOnlyVictimsDied(outcomes, {});
}

TEST_F(Reconfigure, GrowAppendsStandbysAsNewRanks) {
  constexpr int n = 3, added = 2;
  ProcessGroup group(n + added, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    if (index >= n) {
      RANK_OK(ecclCommInitStandby(&comm, id, nullptr), nullptr);
      ecclCommStats_t s = statsOf(comm);
      RANK_CHECK(s.rank >= n && s.nranks == n + added && s.epoch == 2, "grown standby is rank " + std::to_string(s.rank));
    } else {
      RANK_OK(ecclCommInitRank(&comm, n, id, index), nullptr);
      checkAllreduce(comm);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // both standbys registered
      RANK_CHECK(ecclCommGrow(comm, 5) != ecclSuccess, "grow past the standbys succeeded");
      RANK_CHECK(std::string(ecclGetLastError(comm)).find("standbys") != std::string::npos, ecclGetLastError(comm));
      RANK_OK(ecclCommGrow(comm, added), comm);
      int rank, count;
      RANK_OK(ecclCommUserRank(comm, &rank), comm);
      RANK_OK(ecclCommCount(comm, &count), comm);
      RANK_CHECK(rank == index && count == n + added, "after grow: rank " + std::to_string(rank));
    }
    checkAllreduce(comm);
    for (int root = 0; root < n + added; ++root) {
      std::vector<int32_t> b(1000, 0);
      int rank;
      RANK_OK(ecclCommUserRank(comm, &rank), comm);
      if (rank == root) std::fill(b.begin(), b.end(), root * 7 + 1);
      RANK_OK(ecclBroadcast(b.data(), b.data(), b.size(), ecclInt32, root, comm, nullptr), comm);
      for (int32_t x : b) RANK_CHECK(x == root * 7 + 1, "broadcast from " + std::to_string(root));
    }
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  expectOnlyVictimsDied(outcomes, {});
}

TEST_F(Reconfigure, EagerStandbyIsPromotedWithoutOpeningAConnection) {
  constexpr int n = 4, victim = 1;
  ProcessGroup group(n + 1, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    if (index == n) {
      setenv("ECCL_PREPARE", "eager", 1);
      RANK_OK(ecclCommInitStandby(&comm, id, nullptr), nullptr);
      ecclCommStats_t s = statsOf(comm);
      RANK_CHECK(s.rank == victim && s.connectionsOpened == 0,
                 "eager standby opened " + std::to_string(s.connectionsOpened) + " when promoted");
      checkQueuePairsFollowLanes(s);
      checkAllreduce(comm);
      RANK_OK(ecclCommDestroy(comm), comm);
      return;
    }
    RANK_OK(ecclCommInitRank(&comm, n, id, index), nullptr);
    checkAllreduce(comm);
    waitForEagerStandbyLanes(comm, 3);
    if (index == victim) dieSoon();
    std::vector<float> v(4096, 1.0f);
    while (ecclAllReduce(v.data(), v.data(), v.size(), ecclFloat32, ecclSum, comm, nullptr) == ecclSuccess) {
    }
    RANK_OK(ecclCommRecover(comm, ecclRecoverReplace), comm);
    ecclCommStats_t s = statsOf(comm);
    RANK_CHECK(s.connectionsOpened == 0, "opened " + std::to_string(s.connectionsOpened) + " with an eager standby");
    checkQueuePairsFollowLanes(s);
    checkAllreduce(comm);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  expectOnlyVictimsDied(outcomes, {victim});
}

// An eager standby holds lanes to every member before it is chosen, so a
// migration to it opens nothing, neither while preparing nor at the
// switchover, and the stats say so.
TEST_F(Reconfigure, AMigrationToAnEagerStandbyOpensNoConnection) {
  constexpr int n = 4, leaver = 2;
  ProcessGroup group(n + 1, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    if (index == n) {
      setenv("ECCL_PREPARE", "eager", 1);
      RANK_OK(ecclCommInitStandby(&comm, id, nullptr), nullptr);
      RANK_OK(ecclCommSwitchover(comm), comm);
      ecclCommStats_t s = statsOf(comm);
      RANK_CHECK(s.rank == leaver && s.connectionsPrepared == 0 && s.connectionsOpened == 0,
                 "the eager joiner prepared " + std::to_string(s.connectionsPrepared) + " and opened " +
                     std::to_string(s.connectionsOpened));
      checkQueuePairsFollowLanes(s);
      checkAllreduce(comm, 2);
      RANK_OK(ecclCommDestroy(comm), comm);
      return;
    }
    RANK_OK(ecclCommInitRank(&comm, n, id, index), nullptr);
    checkAllreduce(comm);
    waitForEagerStandbyLanes(comm, coll::latencyPeers(index, n).size());
    RANK_OK(ecclBarrier(comm), comm);  // everyone's lanes are up before anyone prepares
    if (index == 0) RANK_OK(ecclCommPrepare(comm, leaver), comm);
    awaitEveryoneReady(comm);
    RANK_OK(ecclCommSwitchover(comm), comm);
    if (index == leaver) {
      RANK_OK(ecclCommDestroy(comm), comm);
      return;
    }
    ecclCommStats_t s = statsOf(comm);
    RANK_CHECK(s.epoch == 2 && s.connectionsPrepared == 0 && s.connectionsOpened == 0,
               "epoch " + std::to_string(s.epoch) + ": prepared " + std::to_string(s.connectionsPrepared) +
                   ", opened " + std::to_string(s.connectionsOpened) + " with an eager joiner");
    checkQueuePairsFollowLanes(s);
    checkAllreduce(comm, 2);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  expectOnlyVictimsDied(outcomes, {});
}

TEST_F(Reconfigure, AJoinerDyingWhilePreparingFailsThePreparationOnly) {
  constexpr int n = 3;
  ProcessGroup group(n + 1, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    if (index == n) {
      RANK_OK(ecclCommInitStandby(&comm, id, nullptr), nullptr);
      raise(SIGKILL);  // chosen as the joiner; dies before switching
    }
    RANK_OK(ecclCommInitRank(&comm, n, id, index), nullptr);
    checkAllreduce(comm);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the standby registered
    if (index == 0) RANK_OK(ecclCommPrepare(comm, 1), comm);
    ecclPrepareState_t state = ecclPrepareNone;
    for (int i = 0;; ++i) {
      RANK_CHECK(i < 3000, "the preparation did not fail");
      checkAllreduce(comm, i);  // the old view keeps working throughout
      RANK_OK(ecclCommPrepareStatus(comm, &state, nullptr), comm);
      int32_t failed = state == ecclPrepareFailed;
      RANK_OK(ecclAllReduce(&failed, &failed, 1, ecclInt32, ecclMin, comm, nullptr), comm);
      if (failed) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::string why = ecclGetLastError(comm);
    RANK_CHECK(why.find("joiner") != std::string::npos, "reason does not name the joiner: " + why);
    RANK_CHECK(ecclCommSwitchover(comm) != ecclSuccess, "switched over to a dead joiner");
    RANK_OK(ecclBarrier(comm), comm);
    checkAllreduce(comm);
    RANK_CHECK(statsOf(comm).epoch == 1, "the view changed");
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  expectOnlyVictimsDied(outcomes, {n});
}

TEST_F(Reconfigure, AMemberDyingDuringSwitchoverAbortsItAndRecoveryRetries) {
  constexpr int n = 4, leaver = 1, victim = 3;
  ProcessGroup group(n + 2, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    if (index >= n) {
      // The first standby becomes the joiner; the second replaces the victim.
      if (index == n + 1) std::this_thread::sleep_for(std::chrono::milliseconds(500));
      RANK_OK(ecclCommInitStandby(&comm, id, nullptr), nullptr);
      ecclCommStats_t s = statsOf(comm);
      ecclPrepareState_t state;
      RANK_OK(ecclCommPrepareStatus(comm, &state, nullptr), comm);
      if (state == ecclPreparePreparing || state == ecclPrepareReady) {  // whichever registered first
        // The stayers are revoked by the victim's death but still finish
        // the vote, so the joiner hears from them well before the 15 s
        // op deadline.
        auto start = std::chrono::steady_clock::now();
        RANK_CHECK(ecclCommSwitchover(comm) != ecclSuccess, "the joiner switched over into an aborted view");
        RANK_CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(8),
                   "the joiner's vote waited for a deadline");
        ecclCommDestroy(comm);
        return;
      }
      // Epoch 2 was the aborted vote's; its number is never reused, so a
      // member that voted yes and then stalled can never pass for current.
      RANK_CHECK(s.rank == victim && s.epoch == 3,
                 "spare standby became rank " + std::to_string(s.rank) + " at epoch " + std::to_string(s.epoch));
      checkAllreduce(comm);
      RANK_OK(ecclCommDestroy(comm), comm);
      return;
    }
    joinAndPrepare(&comm, n, id, index, leaver, 800);  // the standbys registered first
    if (index == victim) dieSoon();
    // Vote only once the victim's death has revoked this member.
    std::this_thread::sleep_for(std::chrono::milliseconds(900));
    ecclResult_t r = ecclCommSwitchover(comm);
    std::string why = ecclGetLastError(comm);
    RANK_CHECK(r != ecclSuccess && why.find("rank 3") != std::string::npos, "switchover did not abort naming rank 3: " + why);
    RANK_OK(ecclCommRecover(comm, ecclRecoverReplaceOrShrink), comm);
    int rank, count;
    RANK_OK(ecclCommUserRank(comm, &rank), comm);
    RANK_OK(ecclCommCount(comm, &count), comm);
    RANK_CHECK(rank == index && count == n, "after the retry: rank " + std::to_string(rank) + " of " + std::to_string(count));
    checkAllreduce(comm);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  expectOnlyVictimsDied(outcomes, {victim});
}

// The joiner dies after everyone is prepared, so only the in-band vote can
// notice: the vote fails on every member without hanging, the coordinator
// aborts the switchover, and the old view runs on without a recovery (no
// member of it failed).
TEST_F(Reconfigure, AJoinerDyingAtTheSwitchoverAbortsItAndTheOldViewRunsOn) {
  constexpr int n = 4, leaver = 2;
  ProcessGroup group(n + 1, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    if (index == n) {
      RANK_OK(ecclCommInitStandby(&comm, id, nullptr), nullptr);
      ecclPrepareState_t state = ecclPrepareNone;
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20) * timeScale();
      while (state != ecclPrepareReady) {
        RANK_CHECK(std::chrono::steady_clock::now() < until, "the preparation was not READY within 20 s");
        RANK_OK(ecclCommPrepareStatus(comm, &state, nullptr), comm);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      dieSoon();
    }
    joinAndPrepare(&comm, n, id, index, leaver, 500);  // the standbys registered first
    auto start = std::chrono::steady_clock::now();
    ecclResult_t r = ecclCommSwitchover(comm);
    std::string why = ecclGetLastError(comm);
    RANK_CHECK(r == ecclRemoteError && why.find("joiner") != std::string::npos,
               "switchover did not abort naming the joiner: " + why);
    RANK_CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10), "the abort took past 10 s");
    ecclPrepareState_t state;
    RANK_OK(ecclCommPrepareStatus(comm, &state, nullptr), comm);
    RANK_CHECK(state == ecclPrepareFailed, "the preparation is not FAILED after the abort");
    RANK_OK(ecclBarrier(comm), comm);
    checkAllreduce(comm, 3);
    ecclCommStats_t s = statsOf(comm);
    RANK_CHECK(s.epoch == 1 && s.reconfigurations == 0, "the view changed: epoch " + std::to_string(s.epoch));
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  expectOnlyVictimsDied(outcomes, {n});
}

// A leaver may destroy its communicator at its last boundary instead of
// calling switchover: the token it leaves with lets the joiner vote, and
// the rest switch over without it.
TEST_F(Reconfigure, ALeaverDestroyingAtItsBoundaryStillHandsItsRankOver) {
  constexpr int n = 3, leaver = 1;
  ProcessGroup group(n + 1, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    if (index == n) {
      RANK_OK(ecclCommInitStandby(&comm, id, nullptr), nullptr);
      RANK_OK(ecclCommSwitchover(comm), comm);
      RANK_CHECK(statsOf(comm).rank == leaver && statsOf(comm).epoch == 2, "joiner stats after the switchover");
      checkAllreduce(comm, 9);
      RANK_OK(ecclCommDestroy(comm), comm);
      return;
    }
    joinAndPrepare(&comm, n, id, index, leaver, 500);  // the standbys registered first
    if (index == leaver) {
      RANK_OK(ecclCommDestroy(comm), comm);
      return;
    }
    RANK_OK(ecclCommSwitchover(comm), comm);
    ecclCommStats_t s = statsOf(comm);
    RANK_CHECK(s.epoch == 2 && s.rank == index, "stayer after the switchover");
    checkAllreduce(comm, 9);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  expectOnlyVictimsDied(outcomes, {});
}

// A member that dies right after its own vote ended yes died in the next
// view: whether the others' votes all saw yes or some missed its last frame
// (then the coordinator settles the split on a yes report), everyone ends
// up in epoch 2 with the joiner holding the leaver's rank, and recovery
// replaces the victim from there. An abort would have left the leaver in
// the view and the joiner retired.
TEST_F(Reconfigure, AMemberDyingRightAfterItsVoteDiesInTheNextView) {
  constexpr int n = 4, leaver = 1, victim = 3;
  ProcessGroup group(n + 2, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    auto recoverInto = [&](int wantRank) {
      // The switchover either succeeded (the victim's death shows on the
      // next op) or said to recover; either way epoch 2 is current.
      if (statsOf(comm).epoch == 2) {
        int64_t x = 1;
        ecclResult_t r = ecclAllReduce(&x, &x, 1, ecclInt64, ecclSum, comm, nullptr);
        RANK_CHECK(r != ecclSuccess, "an allreduce with the dead victim succeeded");
      }
      RANK_OK(ecclCommRecover(comm, ecclRecoverReplace), comm);
      ecclCommStats_t s = statsOf(comm);
      RANK_CHECK(s.rank == wantRank && s.nranks == n && s.epoch == 3,
                 "after recovery: rank " + std::to_string(s.rank) + " epoch " + std::to_string(s.epoch));
      checkAllreduce(comm, 4);
      RANK_OK(ecclCommDestroy(comm), comm);
    };
    if (index >= n) {
      if (index == n + 1) std::this_thread::sleep_for(std::chrono::milliseconds(500));
      RANK_OK(ecclCommInitStandby(&comm, id, nullptr), nullptr);
      // Whichever standby registered first is the joiner; the other is the
      // spare, which replaces the victim at epoch 3.
      ecclPrepareState_t state;
      RANK_OK(ecclCommPrepareStatus(comm, &state, nullptr), comm);
      if (state != ecclPreparePreparing && state != ecclPrepareReady) {
        RANK_CHECK(statsOf(comm).rank == victim && statsOf(comm).epoch == 3,
                   "spare placement: rank " + std::to_string(statsOf(comm).rank) + " epoch " +
                       std::to_string(statsOf(comm).epoch));
        checkAllreduce(comm, 4);
        RANK_OK(ecclCommDestroy(comm), comm);
        return;
      }
      ecclResult_t r = ecclCommSwitchover(comm);
      RANK_CHECK(statsOf(comm).rank == leaver && statsOf(comm).epoch == 2,
                 std::string("the joiner is not rank 1 of epoch 2 (the vote was aborted?): ") + ecclGetLastError(comm));
      (void)r;
      recoverInto(leaver);
      return;
    }
    joinAndPrepare(&comm, n, id, index, leaver, 800);  // the standbys registered first
    ecclResult_t r = ecclCommSwitchover(comm);
    if (index == victim) {
      raise(SIGKILL);
      _exit(9);
    }
    if (index == leaver) {
      RANK_OK(r, comm);
      std::vector<float> x(4);
      RANK_CHECK(ecclAllReduce(x.data(), x.data(), 4, ecclFloat32, ecclSum, comm, nullptr) == ecclInvalidUsage,
                 "the leaver is still in the view");
      RANK_OK(ecclCommDestroy(comm), comm);
      return;
    }
    RANK_CHECK(r == ecclSuccess || std::string(ecclGetLastError(comm)).find("ecclCommRecover") != std::string::npos,
               std::string("switchover: ") + ecclGetLastError(comm));
    recoverInto(index);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  expectOnlyVictimsDied(outcomes, {victim});
}

}  // namespace
}  // namespace eccl::test
