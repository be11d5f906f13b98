// Shared pieces of the membership tests (elastic_test, reconfigure_test):
// the environment they run in, stats, a checked allreduce, a victim's
// death, and the outcome check.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/multiproc.h"

namespace eccl::test {

constexpr int kElasticLanes = 2;

// Two lanes per peer (so delta counts are known). Deaths are seen through
// dropped connections; the heartbeat timeout is long enough that a host
// stall under a parallel ctest never passes for a failure (a test about
// silence sets its own).
class ElasticTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("ECCL_SOCKET_IFNAME", "lo", 1);
    // Stretched in the Soft-RoCE VM (CI: connecting a lane on emulated
    // CPUs of a loaded host ran past 15 s, and so did its retry).
    setenv("ECCL_TIMEOUT_MS", std::to_string(15000 * timeScale()).c_str(), 1);
    setenv("ECCL_HEARTBEAT_MS", "100", 1);
    setenv("ECCL_HEARTBEAT_TIMEOUT_MS", std::to_string(3000 * timeScale()).c_str(), 1);
    setenv("ECCL_NSOCKS_PERPEER", std::to_string(kElasticLanes).c_str(), 1);
    // These tests count the lanes a reconfiguration touches. A same-host
    // collective that reads its peers in place opens a lane to every peer
    // right after one (docs/transport.md), and the survivors' lanes to a
    // joiner still switching raced into its count under ASan;
    // direct_read_test covers reading in place across a replacement.
    setenv("ECCL_SHM_DIRECT_BYTES", "0", 1);
  }
  void TearDown() override {
    for (const char* v : {"ECCL_TIMEOUT_MS", "ECCL_HEARTBEAT_MS", "ECCL_HEARTBEAT_TIMEOUT_MS", "ECCL_NSOCKS_PERPEER",
                          "ECCL_SHM_DIRECT_BYTES"})
      unsetenv(v);
  }
};

// Over verbs (ECCL_TRANSPORT=ib) every lane is one queue pair, so the
// reconfiguration's queue-pair counts equal its lane counts; over TCP and
// shared memory no queue pair exists at all.
inline void checkQueuePairsFollowLanes(const ecclCommStats_t& s) {
  const char* transport = getenv("ECCL_TRANSPORT");
  const uint64_t perLane = transport && std::string(transport) == "ib" ? 1 : 0;
  auto line = [](const char* what, uint64_t qps, uint64_t lanes) {
    return std::string(what) + ": " + std::to_string(qps) + " queue pairs for " + std::to_string(lanes) + " lanes";
  };
  RANK_CHECK(s.queuePairsOpened == s.connectionsOpened * perLane, line("opened", s.queuePairsOpened, s.connectionsOpened));
  RANK_CHECK(s.queuePairsClosed == s.connectionsClosed * perLane, line("closed", s.queuePairsClosed, s.connectionsClosed));
  RANK_CHECK(s.queuePairsPrepared == s.connectionsPrepared * perLane,
             line("prepared", s.queuePairsPrepared, s.connectionsPrepared));
  RANK_CHECK(s.queuePairsOpen == s.openConnections * perLane, line("open", s.queuePairsOpen, s.openConnections));
}

// True on every rank once every rank of the view saw the preparation READY.
inline bool everyoneReady(ecclComm_t comm) {
  ecclPrepareState_t state;
  RANK_OK(ecclCommPrepareStatus(comm, &state, nullptr), comm);
  RANK_CHECK(state != ecclPrepareFailed, std::string("preparation failed: ") + ecclGetLastError(comm));
  int32_t ready = state == ecclPrepareReady;
  RANK_OK(ecclAllReduce(&ready, &ready, 1, ecclInt32, ecclMin, comm, nullptr), comm);
  return ready == 1;
}

// Polls everyoneReady (running `eachStep` between polls) until it is true,
// for at most 20 s scaled: bounded by time, not by a count of polls, since
// a loaded host makes each poll quick and the preparation slow.
inline void awaitEveryoneReady(ecclComm_t comm, const std::function<void(int)>& eachStep = {}) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20) * timeScale();
  for (int step = 0; !everyoneReady(comm); ++step) {
    RANK_CHECK(std::chrono::steady_clock::now() < until, "the preparation was not READY on every rank within 20 s");
    if (eachStep) eachStep(step);
    else std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
}

// Every rank contributes rank+1 (+ salt); checks the exact sum.
inline void checkAllreduce(ecclComm_t comm, int64_t salt = 0) {
  int n, rank;
  RANK_OK(ecclCommCount(comm, &n), comm);
  RANK_OK(ecclCommUserRank(comm, &rank), comm);
  std::vector<int64_t> v(50000, rank + 1 + salt);
  RANK_OK(ecclAllReduce(v.data(), v.data(), v.size(), ecclInt64, ecclSum, comm, nullptr), comm);
  int64_t want = int64_t(n) * (n + 1) / 2 + salt * n;
  for (int64_t x : v) RANK_CHECK(x == want, "allreduce gave " + std::to_string(x) + ", want " + std::to_string(want));
}

// Dies after the peers have surely read everything it sent (a process
// that dies with unread input resets its connections, losing sent data).
[[noreturn]] inline void dieSoon() {
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  raise(SIGKILL);
  _exit(9);
}

// The victims died of SIGKILL; every other process exited cleanly.
inline void expectOnlyVictimsDied(const std::vector<RankOutcome>& outcomes, const std::set<int>& victims) {
  for (size_t r = 0; r < outcomes.size(); ++r) {
    if (victims.count(static_cast<int>(r)))
      EXPECT_TRUE(!outcomes[r].exited && outcomes[r].signal == SIGKILL) << describe(outcomes);
    else
      EXPECT_TRUE(outcomes[r].exited && outcomes[r].exitCode == 0) << describe(outcomes);
  }
}

}  // namespace eccl::test
