// Level 2: memberships named outright (ecclCommReconfigure, what c10d's
// reconfigure maps to). Replace, shrink and grow by member ids, the first
// view formed from standbys alone, and the refusals: callers that disagree,
// a reused uuid, a named member that dies while the others wait.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "coll/algorithms.h"
#include "tests/support/elastic.h"

namespace eccl::test {
namespace {

constexpr int kLanes = kElasticLanes;
using NamedReconfigure = ElasticTest;

// Member ids the processes publish to each other (mapped before they fork).
struct Board {
  std::atomic<uint64_t> member[16];
  std::atomic<int> done{0};
};

Board* mapBoard() {
  void* p = mmap(nullptr, sizeof(Board), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
  return new (p) Board;
}

uint64_t memberOf(ecclComm_t comm) {
  uint64_t id = 0;
  RANK_OK(ecclCommMemberId(comm, &id), comm);
  return id;
}

void publish(Board* b, int index, ecclComm_t comm) { b->member[index] = memberOf(comm); }

std::vector<uint64_t> await(Board* b, const std::vector<int>& indices) {
  std::vector<uint64_t> out;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (int i : indices) {
    while (b->member[i] == 0) {
      RANK_CHECK(std::chrono::steady_clock::now() < until, "process " + std::to_string(i) + " never published its id");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    out.push_back(b->member[i]);
  }
  return out;
}

void waitUntilDone(Board* b, int count) {
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(40);
  while (b->done < count) {
    RANK_CHECK(std::chrono::steady_clock::now() < until, "the others never finished");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// Rank 2 of 5 dies; survivors and the standby name the view with the
// standby in rank 2's place. Only rank 2's partners open lanes (to the
// standby); everything else is inherited.
TEST_F(NamedReconfigure, ReplacingADeadMemberByNameOpensOnlyItsPartnersLanes) {
  constexpr int n = 5, victim = 2, standby = n;
  Board* board = mapBoard();
  ProcessGroup group(n + 1, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    if (index == standby) {
      RANK_OK(ecclCommRegisterStandby(&comm, id, nullptr), nullptr);
      publish(board, index, comm);
      int rank = 0;
      RANK_OK(ecclCommUserRank(comm, &rank), comm);
      RANK_CHECK(rank == -1, "a registered standby has rank " + std::to_string(rank));
      float x = 0;
      RANK_CHECK(ecclAllReduce(&x, &x, 1, ecclFloat32, ecclSum, comm, nullptr) == ecclInvalidUsage,
                 "a standby ran a collective");
    } else {
      RANK_OK(ecclCommInitRank(&comm, n, id, index), nullptr);
      publish(board, index, comm);
      checkAllreduce(comm);
      if (index == victim) dieSoon();
      std::vector<float> v(1024, 1.0f);
      while (ecclAllReduce(v.data(), v.data(), v.size(), ecclFloat32, ecclSum, comm, nullptr) == ecclSuccess) {
      }
    }
    std::vector<uint64_t> next = await(board, {0, 1, standby, 3, 4});
    RANK_OK(ecclCommReconfigure(comm, next.data(), n, 0x5eed0001, 0), comm);
    ecclCommStats_t s = statsOf(comm);
    int want = index == standby ? victim : index;
    RANK_CHECK(s.rank == want && s.nranks == n && s.epoch == 2, "rank " + std::to_string(s.rank) + " epoch " +
                                                                   std::to_string(s.epoch));
    auto peers = coll::latencyPeers(want, n);
    bool usesVictim = std::count(peers.begin(), peers.end(), victim) > 0;
    uint64_t wantOpened = index == standby ? peers.size() * kLanes : (usesVictim ? kLanes : 0u);
    RANK_CHECK(s.connectionsOpened == wantOpened,
               "opened " + std::to_string(s.connectionsOpened) + ", want " + std::to_string(wantOpened));
    if (index == standby) RANK_CHECK(s.joinedEpoch == 2, "joined at " + std::to_string(s.joinedEpoch));
    checkQueuePairsFollowLanes(s);
    checkAllreduce(comm, 2);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  expectOnlyVictimsDied(outcomes, {victim});
  munmap(board, sizeof(Board));
}

// A live member is left out (shrink: it leaves), then two standbys are
// appended (grow), each by naming the whole membership.
TEST_F(NamedReconfigure, ShrinkThenGrowByName) {
  constexpr int n = 4, leaver = 1, s1 = n, s2 = n + 1;
  Board* board = mapBoard();
  ProcessGroup group(n + 2, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    if (index >= n) {
      RANK_OK(ecclCommRegisterStandby(&comm, id, nullptr), nullptr);
      publish(board, index, comm);
      std::vector<uint64_t> grown = await(board, {0, 2, 3, s1, s2});
      RANK_OK(ecclCommReconfigure(comm, grown.data(), 5, 0x5eed0003, 0), comm);
      ecclCommStats_t s = statsOf(comm);
      RANK_CHECK(s.rank == (index == s1 ? 3 : 4) && s.nranks == 5 && s.epoch == 3, "grown rank " + std::to_string(s.rank));
      checkAllreduce(comm, 3);
      RANK_OK(ecclCommDestroy(comm), comm);
      ++board->done;
      return;
    }
    RANK_OK(ecclCommInitRank(&comm, n, id, index), nullptr);
    publish(board, index, comm);
    checkAllreduce(comm);
    if (index == leaver) {
      waitUntilDone(board, n + 1);  // the others shrank and grew without it
      RANK_OK(ecclCommDestroy(comm), comm);
      return;
    }
    std::vector<uint64_t> shrunk = await(board, {0, 2, 3});
    RANK_OK(ecclCommReconfigure(comm, shrunk.data(), 3, 0x5eed0002, 0), comm);
    ecclCommStats_t s = statsOf(comm);
    int want = index == 0 ? 0 : index - 1;
    RANK_CHECK(s.rank == want && s.nranks == 3 && s.epoch == 2, "shrunk rank " + std::to_string(s.rank));
    checkAllreduce(comm, 2);
    std::vector<uint64_t> grown = await(board, {0, 2, 3, s1, s2});
    RANK_OK(ecclCommReconfigure(comm, grown.data(), 5, 0x5eed0003, 0), comm);
    s = statsOf(comm);
    RANK_CHECK(s.rank == want && s.nranks == 5 && s.epoch == 3, "grown rank " + std::to_string(s.rank));
    checkAllreduce(comm, 3);
    RANK_OK(ecclCommDestroy(comm), comm);
    ++board->done;
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
  munmap(board, sizeof(Board));
}

// A live member left out of a membership (torchft's quorum leaves out a
// replica that was late) is a standby of the job again: the next
// membership names it, and only its partners open links to it.
TEST_F(NamedReconfigure, AMemberLeftOutIsNamedAgainLater) {
  constexpr int n = 4, late = 3;
  Board* board = mapBoard();
  ProcessGroup group(n, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, n, id, index), nullptr);
    publish(board, index, comm);
    checkAllreduce(comm);
    std::vector<uint64_t> all = await(board, {0, 1, 2, 3});
    if (index != late) {
      std::vector<uint64_t> without = await(board, {0, 1, 2});
      RANK_OK(ecclCommReconfigure(comm, without.data(), 3, 0x1a7e0002, 0), comm);
      RANK_CHECK(statsOf(comm).nranks == 3 && statsOf(comm).epoch == 2, "shrunk");
      checkAllreduce(comm, 2);
      ++board->done;
    } else {
      waitUntilDone(board, n - 1);  // it was late: the others went on without it
    }
    RANK_OK(ecclCommReconfigure(comm, all.data(), n, 0x1a7e0003, 0), comm);
    ecclCommStats_t s = statsOf(comm);
    RANK_CHECK(s.rank == index && s.nranks == n && s.epoch == 3, "back at rank " + std::to_string(s.rank));
    if (index != late)
      RANK_CHECK(s.connectionsOpened <= static_cast<uint64_t>(kLanes),
                 "a member kept opened " + std::to_string(s.connectionsOpened) + " connections");
    checkAllreduce(comm, 3);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
  munmap(board, sizeof(Board));
}

// No ranks at all: three standbys name each other and form epoch 1.
TEST_F(NamedReconfigure, StandbysAloneFormTheFirstView) {
  constexpr int n = 3;
  Board* board = mapBoard();
  ProcessGroup group(n, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    RANK_OK(ecclCommRegisterStandby(&comm, id, nullptr), nullptr);
    publish(board, index, comm);
    std::vector<uint64_t> all = await(board, {2, 0, 1});  // the order names the ranks
    RANK_OK(ecclCommReconfigure(comm, all.data(), n, 7, 0), comm);
    ecclCommStats_t s = statsOf(comm);
    int want = index == 2 ? 0 : index + 1;
    RANK_CHECK(s.rank == want && s.nranks == n && s.epoch == 1, "formed as rank " + std::to_string(s.rank));
    checkAllreduce(comm);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
  munmap(board, sizeof(Board));
}

// Every refusal reaches every caller with the reason, and the view is
// unchanged: then a proper reconfiguration works.
TEST_F(NamedReconfigure, DisagreementAReusedUuidAndADeadNamedMemberAreRefused) {
  constexpr int n = 3, doomed = n;
  Board* board = mapBoard();
  ProcessGroup group(n + 1, [&](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    if (index == doomed) {  // a standby that dies while the others name it
      RANK_OK(ecclCommRegisterStandby(&comm, id, nullptr), nullptr);
      publish(board, index, comm);
      while (board->done < 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      raise(SIGKILL);
    }
    RANK_OK(ecclCommInitRank(&comm, n, id, index), nullptr);
    publish(board, index, comm);
    std::vector<uint64_t> view = await(board, {0, 1, 2});
    // Rank 0 names a different order: everyone is refused, naming both lists.
    std::vector<uint64_t> mine = index == 0 ? std::vector<uint64_t>{view[1], view[0], view[2]} : view;
    ecclResult_t r = ecclCommReconfigure(comm, mine.data(), n, 100, 5000);
    std::string why = ecclGetLastError(comm);
    RANK_CHECK(r == ecclInvalidUsage && why.find("disagree") != std::string::npos, "disagreement: " + why);
    RANK_OK(ecclCommReconfigure(comm, view.data(), n, 101, 0), comm);  // same view, new epoch, nothing moves
    ecclCommStats_t s = statsOf(comm);
    RANK_CHECK(s.epoch == 2 && s.connectionsOpened == 0 && s.connectionsClosed == 0, "epoch " + std::to_string(s.epoch));
    r = ecclCommReconfigure(comm, view.data(), n, 101, 5000);
    why = ecclGetLastError(comm);
    RANK_CHECK(r == ecclInvalidUsage && why.find("fresh uuid") != std::string::npos, "reused uuid: " + why);
    // Naming the standby that then dies: refused for everyone, naming it.
    std::vector<uint64_t> withDoomed = view;
    withDoomed.push_back(await(board, {doomed})[0]);
    if (index == 0) ++board->done;
    r = ecclCommReconfigure(comm, withDoomed.data(), n + 1, 102, 10000);
    why = ecclGetLastError(comm);
    RANK_CHECK(r == ecclInvalidUsage && (why.find("gone") != std::string::npos || why.find("not registered") != std::string::npos),
               "dead named member: " + why);
    checkAllreduce(comm);
    RANK_CHECK(statsOf(comm).epoch == 2, "the view moved");
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  expectOnlyVictimsDied(outcomes, {doomed});
  munmap(board, sizeof(Board));
}

}  // namespace
}  // namespace eccl::test
