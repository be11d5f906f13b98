// A pipeline-parallel job with no data-parallel replica comes back from a
// killed stage without reading a file: 4 stages, several micro-batches,
// deterministic element-wise compute, every stage-boundary send logged,
// and every 2 iterations each stage snapshots a different quarter of its
// parameter blocks into the other ranks' memory (sparse). The logs are
// truncated at the oldest snapshot a stage's dense view still uses.
//
// A stage is SIGKILLed in the middle of an iteration. A standby takes its
// rank and restores its blocks from the survivors' memory (each block from
// the version it was last snapshotted at); its neighbours replay their
// logged sends from the oldest of those versions, and only it recomputes,
// block by block from each block's own version (the math is element-wise,
// so a block's update needs only its inputs). Every rank then redoes the
// interrupted iteration (its first attempt's log records are discarded)
// and trains on; the final parameters equal a failure-free run bit for bit.
// Also: two stages killed at once with two replicas, and a stage and its
// only replica killed together (restore names the lost blocks).
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tests/support/multiproc.h"

namespace eccl::test {
namespace {

constexpr int kStages = 4, kMicro = 3, kIters = 12, kHidden = 512, kBlocks = 4, kEvery = 2;
constexpr int kBlock = kHidden / kBlocks;
constexpr int kFailIter = 9, kFailMicro = 1;
using Vec = std::vector<float>;

struct Stage {
  int s;
  Vec w, grad;
  int computeCalls = 0;
  explicit Stage(int stage) : s(stage), w(kHidden), grad(kHidden, 0.0f) {
    for (int i = 0; i < kHidden; ++i) w[i] = 1.0f + 0.001f * float(i + 7 * stage);
  }
  void step(int from = 0, int to = kHidden) {
    for (int i = from; i < to; ++i) w[i] -= 1e-3f * grad[i] / kMicro, grad[i] = 0.0f;
  }
  // Forward: what this stage sends downstream (the last stage: the loss's
  // gradient, sent back upstream, its own gradient accumulated).
  Vec forward(const Vec& up) {
    computeCalls++;
    Vec out(kHidden);
    for (int i = 0; i < kHidden; ++i) {
      if (s == 0) out[i] = up[i] * w[i];
      else if (s < kStages - 1) out[i] = up[i] * w[i] + (s == 1 ? 0.5f : 0.25f);
      else out[i] = up[i] * w[i] - 1.0f, grad[i] += out[i] * up[i];
    }
    return out;
  }
  // Backward of the middle and first stages: accumulates, returns what goes upstream.
  Vec backward(const Vec& down, const Vec& up) {
    computeCalls++;
    Vec g(kHidden);
    for (int i = 0; i < kHidden; ++i) g[i] = down[i] * w[i], grad[i] += down[i] * up[i];
    return g;
  }
  // Replay of one micro-batch for indices [from, to): the gradient only
  // (what the stage sent then, its neighbours already have).
  void replayGrad(const Vec& up, const Vec& down, int from, int to) {
    for (int i = from; i < to; ++i) {
      if (s == kStages - 1) {
        float g = up[i] * w[i] - 1.0f;
        grad[i] += g * up[i];
      } else {
        grad[i] += down[i] * up[i];
      }
    }
  }
};

Vec input(int iter, int mb) {
  Vec x(kHidden);
  for (int i = 0; i < kHidden; ++i) x[i] = std::sin(0.01f * float(i) + float(iter) + 0.1f * float(mb));
  return x;
}

std::vector<Stage> reference() {
  std::vector<Stage> st;
  for (int s = 0; s < kStages; ++s) st.emplace_back(s);
  for (int it = 1; it <= kIters; ++it) {
    for (int mb = 0; mb < kMicro; ++mb) {
      Vec x = input(it, mb), a0 = st[0].forward(x), a1 = st[1].forward(a0), a2 = st[2].forward(a1);
      Vec g3 = st[3].forward(a2), g2 = st[2].backward(g3, a1), g1 = st[1].backward(g2, a0);
      st[0].backward(g1, x);
    }
    for (auto& s : st) s.step();
  }
  return st;
}

std::string blockName(int b) { return "w.block" + std::to_string(b); }
// Which block a snapshot at iteration `it` holds (a quarter each time).
int blockAt(int it) { return (it / kEvery) % kBlocks; }

void sendVec(ecclComm_t comm, const Vec& v, int peer) {
  RANK_OK(ecclSend(v.data(), v.size(), ecclFloat32, peer, comm, nullptr), comm);
}
Vec recvVec(ecclComm_t comm, int peer, ecclResult_t* rc = nullptr) {
  Vec v(kHidden);
  ecclResult_t r = ecclRecv(v.data(), v.size(), ecclFloat32, peer, comm, nullptr);
  if (rc) *rc = r;
  else RANK_OK(r, comm);
  return v;
}

void snapshot(ecclComm_t comm, const Stage& st, int it) {
  for (int b = 0; b < kBlocks; ++b)
    if (it == 0 || b == blockAt(it))
      RANK_OK(ecclSnapshotPut(comm, it, blockName(b).c_str(), st.w.data() + b * kBlock, kBlock * sizeof(float)), comm);
  RANK_OK(ecclSnapshotCommit(comm, it), comm);
}

// The oldest version this rank's dense view still takes a block from: its
// logs keep everything after it (every stage snapshots on one schedule).
int64_t oldestNeeded(ecclComm_t comm) {
  ecclSnapshotEntry_t entries[kBlocks + 1];
  int count = 0;
  RANK_OK(ecclSnapshotList(comm, entries, kBlocks + 1, &count), comm);
  int64_t oldest = -1;
  for (int i = 0; i < count && i < kBlocks; ++i) oldest = oldest < 0 ? entries[i].version : std::min(oldest, entries[i].version);
  return oldest;
}

void configure(ecclComm_t comm, int replicas, int stage) {
  ecclSnapshotConfig_t cfg{};
  cfg.size = sizeof(cfg);
  cfg.replicas = replicas;
  cfg.replicasSet = 1;
  RANK_OK(ecclSnapshotConfigure(comm, &cfg), comm);
  std::vector<int> peers;
  if (stage > 0) peers.push_back(stage - 1);
  if (stage < kStages - 1) peers.push_back(stage + 1);
  ecclLogConfig_t log{};
  log.size = sizeof(log);
  log.capacityBytes = 16 << 20;
  log.peers = peers.data();
  log.numPeers = static_cast<int>(peers.size());
  RANK_OK(ecclLogConfigure(comm, &log), comm);
}

// Recover and restore until a view with every rank alive restored; -2 and
// `lost` when some blocks lost every replica.
int64_t recoverAndRestore(ecclComm_t comm, bool recoverFirst, std::string* lost) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    if (recoverFirst && ecclCommRecover(comm, ecclRecoverReplace) != ecclSuccess) continue;
    recoverFirst = true;
    int64_t version = -1;
    if (ecclSnapshotRestore(comm, &version) == ecclSuccess) return version;
    std::string why = ecclGetLastError(comm);
    if (why.find("every replica") != std::string::npos) {
      *lost = why;
      return -2;
    }
  }
  throw std::runtime_error(std::string("restore kept failing: ") + ecclGetLastError(comm));
}

// One micro-batch of normal training; false when an op failed (a peer died).
bool microBatch(ecclComm_t comm, Stage& st, int it, int mb, bool dieMidway) {
  RANK_OK(ecclLogSetTag(comm, it, mb), comm);
  const int s = st.s;
  ecclResult_t rc = ecclSuccess;
  auto ok = [&] { return rc == ecclSuccess; };
  auto send = [&](const Vec& v, int peer) {
    if (ok()) rc = ecclSend(v.data(), v.size(), ecclFloat32, peer, comm, nullptr);
  };
  Vec up = s == 0 ? input(it, mb) : recvVec(comm, s - 1, &rc);
  if (!ok()) return false;
  // Before its output goes on: no survivor can finish this iteration.
  if (dieMidway) raise(SIGKILL);
  Vec out = st.forward(up);
  if (s == kStages - 1) {
    send(out, s - 1);
    return ok();
  }
  send(out, s + 1);
  Vec down = recvVec(comm, s + 1, &rc);
  if (!ok()) return false;
  Vec g = st.backward(down, up);
  if (s > 0) send(g, s - 1);
  return ok();
}

// A replacement recomputes alone: each block from the version it was
// restored at up to the interrupted iteration, from the neighbours' logs.
int replay(ecclComm_t comm, Stage& st, const std::vector<int64_t>& blockVersion, int64_t from, int64_t to) {
  int replayed = 0;
  for (int64_t it = from; it <= to; ++it) {
    for (int mb = 0; mb < kMicro; ++mb) {
      Vec up = st.s == 0 ? input(static_cast<int>(it), mb) : recvVec(comm, st.s - 1);
      Vec down = st.s < kStages - 1 ? recvVec(comm, st.s + 1) : Vec();
      for (int b = 0; b < kBlocks; ++b)
        if (blockVersion[b] < it) st.replayGrad(up, down, b * kBlock, (b + 1) * kBlock);
      replayed++;
    }
    for (int b = 0; b < kBlocks; ++b)
      if (blockVersion[b] < it) st.step(b * kBlock, (b + 1) * kBlock);
  }
  return replayed;
}

// `victims` die in iteration kFailIter on receiving micro-batch
// kFailMicro; standbys replace them.
void pipelineRun(int replicas, std::vector<int> victims, bool expectLost) {
  const int standbys = static_cast<int>(victims.size());
  ProcessGroup group(kStages + standbys, [=](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    const std::vector<Stage> ref = reference();
    std::string lost;
    int stage = index;
    int64_t restored = -1;
    Stage st(0);
    if (index >= kStages) {
      RANK_OK(ecclCommInitStandby(&comm, id, nullptr), nullptr);
      RANK_OK(ecclCommUserRank(comm, &stage), comm);
      st = Stage(stage);
      configure(comm, replicas, stage);
      restored = recoverAndRestore(comm, false, &lost);
    } else {
      RANK_OK(ecclCommInitRank(&comm, kStages, id, stage), nullptr);
      st = Stage(stage);
      configure(comm, replicas, stage);
      snapshot(comm, st, 0);
      RANK_OK(ecclSnapshotWait(comm, 0, 30000), comm);
      const bool victim = std::find(victims.begin(), victims.end(), stage) != victims.end();
      int it = 1;
      for (; it <= kIters; ++it) {
        bool ok = true;
        for (int mb = 0; mb < kMicro && ok; ++mb)
          ok = microBatch(comm, st, it, mb, victim && it == kFailIter && mb == kFailMicro);
        if (!ok && victim) raise(SIGKILL);  // the other victim's death reached it first
        if (!ok) break;
        st.step();
        if (it % kEvery == 0) {
          snapshot(comm, st, it);
          if (int64_t oldest = oldestNeeded(comm); oldest >= 0) RANK_OK(ecclLogTruncate(comm, oldest + 1), comm);
        }
      }
      RANK_CHECK(it == kFailIter, "a failure in iteration " + std::to_string(it));
      restored = recoverAndRestore(comm, true, &lost);
      // The interrupted iteration is redone by everyone from its start.
      std::fill(st.grad.begin(), st.grad.end(), 0.0f);
      RANK_OK(ecclLogDiscard(comm, kFailIter), comm);
    }
    if (expectLost) {
      RANK_CHECK(restored == -2, "nothing was lost");
      RANK_CHECK(lost.find("rank " + std::to_string(victims.front()) + " lost") != std::string::npos, lost);
      RANK_OK(ecclCommDestroy(comm), comm);
      return;
    }
    RANK_CHECK(restored >= kEvery, "restored version " + std::to_string(restored));
    // Everyone learns where the replay starts: the replacements' oldest block.
    std::vector<int64_t> blockVersion(kBlocks, -1);
    int64_t from = 0;
    if (index >= kStages) {
      for (int b = 0; b < kBlocks; ++b)
        RANK_OK(ecclSnapshotGet(comm, blockName(b).c_str(), st.w.data() + b * kBlock, kBlock * sizeof(float),
                                &blockVersion[b]),
                comm);
      from = *std::min_element(blockVersion.begin(), blockVersion.end()) + 1;
    }
    int64_t agreed[kStages];
    for (int s = 0; s < kStages; ++s) agreed[s] = s == stage ? from : 0;
    RANK_OK(ecclAllReduce(agreed, agreed, kStages, ecclInt64, ecclMax, comm, nullptr), comm);
    int replayed = 0;
    if (index >= kStages) {
      replayed = replay(comm, st, blockVersion, from, kFailIter - 1);
      RANK_CHECK(replayed == kMicro * int(kFailIter - from), "replayed " + std::to_string(replayed));
    } else {
      for (int peer : {stage - 1, stage + 1})
        if (peer >= 0 && peer < kStages && agreed[peer] > 0)
          RANK_OK(ecclLogReplay(comm, peer, agreed[peer], kFailIter - 1), comm);
    }
    const int before = st.computeCalls;
    for (int it = kFailIter; it <= kIters; ++it) {
      for (int mb = 0; mb < kMicro; ++mb) RANK_CHECK(microBatch(comm, st, it, mb, false), ecclGetLastError(comm));
      st.step();
      if (it % kEvery == 0) {
        snapshot(comm, st, it);
        if (int64_t oldest = oldestNeeded(comm); oldest >= 0) RANK_OK(ecclLogTruncate(comm, oldest + 1), comm);
      }
    }
    // Only the replacement recomputed: a survivor's compute is the normal
    // run's plus the interrupted iteration's first attempt.
    const int perMicro = stage == kStages - 1 ? 1 : 2;
    if (index < kStages)
      RANK_CHECK(st.computeCalls <= perMicro * kMicro * (kIters + 1) && before < perMicro * kMicro * kFailIter,
                 "stage " + std::to_string(stage) + " computed " + std::to_string(st.computeCalls) + " times");
    RANK_CHECK(std::memcmp(st.w.data(), ref[stage].w.data(), kHidden * sizeof(float)) == 0,
               "stage " + std::to_string(stage) + "'s final parameters differ from the failure-free run");
    RANK_OK(ecclSnapshotWait(comm, kIters, 30000), comm);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(150));
  for (int r = 0; r < kStages + standbys; ++r) {
    const auto& o = outcomes[static_cast<size_t>(r)];
    if (std::find(victims.begin(), victims.end(), r) != victims.end())
      EXPECT_TRUE(!o.exited && o.signal == SIGKILL) << describe(outcomes);
    else
      EXPECT_TRUE(o.exited && o.exitCode == 0) << describe(outcomes);
  }
}

class PipelineSnapshot : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("ECCL_SOCKET_IFNAME", "lo", 1);
    setenv("ECCL_TIMEOUT_MS", "15000", 1);
    setenv("ECCL_HEARTBEAT_MS", "100", 1);
  }
};

TEST_F(PipelineSnapshot, AKilledStageComesBackFromPeersMemoryAndOnlyItRecomputes) { pipelineRun(1, {2}, false); }

TEST_F(PipelineSnapshot, TwoStagesKilledAtOnceWithTwoReplicas) { pipelineRun(2, {0, 2}, false); }

TEST_F(PipelineSnapshot, AStageAndItsOnlyReplicaKilledTogetherIsAClearError) { pipelineRun(1, {2, 3}, true); }

}  // namespace
}  // namespace eccl::test
