// Boundary-send logs end to end: a 3-stage pipeline (activations
// downstream, gradients upstream, several micro-batches per iteration,
// deterministic synthetic compute) logs every stage-boundary send. After a
// checkpoint at iteration 3 (logs truncated) and two more iterations the
// middle stage is killed; a standby replaces it, loads the checkpoint, and
// recomputes iterations 4-5 alone from its neighbours' replayed logs. Its
// recomputed outputs equal what the original sent (bit for bit), the
// neighbours recompute nothing, and the final weights equal a failure-free
// run. Bad input: replay of a truncated range, to a peer that is not
// logged, and a corrupted record are each a clear error.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "api/guard.h"
#include "common/crypto.h"
#include "log/log_store.h"
#include "tests/support/multiproc.h"

namespace eccl::test {
namespace {

constexpr int kStages = 3, kMicro = 3, kIters = 6, kHidden = 512, kCheckpoint = 3, kKillAfter = 5;
using Vec = std::vector<float>;

struct Stage {
  Vec w, grad;
  int computeCalls = 0;
  explicit Stage(int s) : w(kHidden), grad(kHidden, 0.0f) {
    for (int i = 0; i < kHidden; ++i) w[i] = 1.0f + 0.001f * float(i + s);
  }
  void step() {
    for (int i = 0; i < kHidden; ++i) w[i] -= 1e-3f * grad[i] / kMicro, grad[i] = 0.0f;
  }
};

Vec input(int iter, int mb) {
  Vec x(kHidden);
  for (int i = 0; i < kHidden; ++i) x[i] = std::sin(0.01f * float(i) + float(iter) + 0.1f * float(mb));
  return x;
}
// The stages' math, shared by the distributed run and the reference.
Vec forward0(Stage& s, const Vec& x) {
  s.computeCalls++;
  Vec a(kHidden);
  for (int i = 0; i < kHidden; ++i) a[i] = x[i] * s.w[i];
  return a;
}
Vec forward1(Stage& s, const Vec& a0) {
  s.computeCalls++;
  Vec a(kHidden);
  for (int i = 0; i < kHidden; ++i) a[i] = a0[i] * s.w[i] + 0.5f;
  return a;
}
Vec lossGrad2(Stage& s, const Vec& a1) {
  s.computeCalls++;
  Vec g(kHidden);
  for (int i = 0; i < kHidden; ++i) g[i] = a1[i] * s.w[i] - 1.0f, s.grad[i] += g[i] * a1[i];
  return g;
}
Vec backward1(Stage& s, const Vec& g2, const Vec& a0) {
  s.computeCalls++;
  Vec g(kHidden);
  for (int i = 0; i < kHidden; ++i) g[i] = g2[i] * s.w[i], s.grad[i] += g2[i] * a0[i];
  return g;
}
void backward0(Stage& s, const Vec& g1, const Vec& x) {
  s.computeCalls++;
  for (int i = 0; i < kHidden; ++i) s.grad[i] += g1[i] * x[i];
}

// The failure-free run in one process.
std::vector<Stage> reference() {
  std::vector<Stage> st{Stage(0), Stage(1), Stage(2)};
  for (int it = 1; it <= kIters; ++it) {
    for (int mb = 0; mb < kMicro; ++mb) {
      Vec x = input(it, mb), a0 = forward0(st[0], x), a1 = forward1(st[1], a0), g2 = lossGrad2(st[2], a1);
      backward0(st[0], backward1(st[1], g2, a0), x);
    }
    for (auto& s : st) s.step();
  }
  return st;
}

uint32_t crcOf(const Vec& v) { return crc32c(v.data(), v.size() * sizeof(float)); }

void sendVec(ecclComm_t comm, const Vec& v, int peer) {
  RANK_OK(ecclSend(v.data(), v.size(), ecclFloat32, peer, comm, nullptr), comm);
}
Vec recvVec(ecclComm_t comm, int peer) {
  Vec v(kHidden);
  RANK_OK(ecclRecv(v.data(), v.size(), ecclFloat32, peer, comm, nullptr), comm);
  return v;
}

std::string checkpointPath(const std::string& dir) { return dir + "/stage1.ckpt"; }

class PipelineLog : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("ECCL_SOCKET_IFNAME", "lo", 1);
    setenv("ECCL_TIMEOUT_MS", "15000", 1);
    setenv("ECCL_HEARTBEAT_MS", "100", 1);
    char tmpl[] = "/tmp/eccl-pipeline-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    unlink(checkpointPath(dir_).c_str());
    rmdir(dir_.c_str());
  }
  std::string dir_;
};

TEST_F(PipelineLog, AReplacementRecomputesAloneFromReplayedLogs) {
  const std::string dir = dir_;
  ProcessGroup group(kStages + 1, [dir](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    const std::vector<Stage> ref = reference();
    if (index == kStages) {
      // The standby: promoted into stage 1, it restores the checkpoint and
      // recomputes iterations 4-5 from the neighbours' replayed sends.
      RANK_OK(ecclCommInitStandby(&comm, id, nullptr), nullptr);
      int rank;
      RANK_OK(ecclCommUserRank(comm, &rank), comm);
      RANK_CHECK(rank == 1, "the standby took rank " + std::to_string(rank));
      Stage s(1);
      std::ifstream in(checkpointPath(dir), std::ios::binary);
      in.read(reinterpret_cast<char*>(s.w.data()), kHidden * sizeof(float));
      RANK_CHECK(bool(in), "no checkpoint to restore");
      std::vector<uint32_t> toStage2, toStage0;
      for (int it = kCheckpoint + 1; it <= kKillAfter; ++it) {
        for (int mb = 0; mb < kMicro; ++mb) {
          Vec a0 = recvVec(comm, 0), a1 = forward1(s, a0);
          toStage2.push_back(crcOf(a1));
          Vec g2 = recvVec(comm, 2);
          toStage0.push_back(crcOf(backward1(s, g2, a0)));
        }
        s.step();
      }
      // What it would have sent: the neighbours compare with what they got.
      RANK_OK(ecclSend(toStage2.data(), toStage2.size(), ecclUint32, 2, comm, nullptr), comm);
      RANK_OK(ecclSend(toStage0.data(), toStage0.size(), ecclUint32, 0, comm, nullptr), comm);
      float loss = 0;
      RANK_OK(ecclAllReduce(&loss, &loss, 1, ecclFloat32, ecclSum, comm, nullptr), comm);
      RANK_OK(ecclLogConfigure(comm, nullptr), comm);
      for (int it = kKillAfter + 1; it <= kIters; ++it) {
        for (int mb = 0; mb < kMicro; ++mb) {
          Vec a0 = recvVec(comm, 0);
          sendVec(comm, forward1(s, a0), 2);
          sendVec(comm, backward1(s, recvVec(comm, 2), a0), 0);
        }
        s.step();
        RANK_OK(ecclAllReduce(&loss, &loss, 1, ecclFloat32, ecclSum, comm, nullptr), comm);
      }
      RANK_CHECK(std::memcmp(s.w.data(), ref[1].w.data(), kHidden * sizeof(float)) == 0,
                 "stage 1's final weights differ from the failure-free run");
      RANK_OK(ecclCommDestroy(comm), comm);
      return;
    }
    const int stage = index;
    RANK_OK(ecclCommInitRank(&comm, kStages, id, stage), nullptr);
    std::vector<int> peers = stage == 1 ? std::vector<int>{0, 2} : std::vector<int>{1};
    ecclLogConfig_t cfg{};
    cfg.size = sizeof(cfg);
    cfg.capacityBytes = 8 << 20;
    cfg.whenFull = ecclLogOnFullError;
    cfg.peers = peers.data();
    cfg.numPeers = static_cast<int>(peers.size());
    RANK_OK(ecclLogConfigure(comm, &cfg), comm);
    Stage s(stage);
    std::vector<uint32_t> fromStage1;  // CRCs of what stage 1 sent us after the checkpoint
    for (int it = 1; it <= kIters; ++it) {
      for (int mb = 0; mb < kMicro; ++mb) {
        RANK_OK(ecclLogSetTag(comm, it, mb), comm);
        Vec x = input(it, mb);
        if (stage == 0) {
          Vec a0 = forward0(s, x);
          sendVec(comm, a0, 1);
          Vec g1 = recvVec(comm, 1);
          if (it > kCheckpoint) fromStage1.push_back(crcOf(g1));
          backward0(s, g1, x);
        } else if (stage == 1) {
          Vec a0 = recvVec(comm, 0);
          sendVec(comm, forward1(s, a0), 2);
          sendVec(comm, backward1(s, recvVec(comm, 2), a0), 0);
        } else {
          Vec a1 = recvVec(comm, 1);
          if (it > kCheckpoint) fromStage1.push_back(crcOf(a1));
          sendVec(comm, lossGrad2(s, a1), 1);
        }
      }
      s.step();
      if (it == kCheckpoint) {
        if (stage == 1) {
          std::ofstream out(checkpointPath(dir), std::ios::binary);
          out.write(reinterpret_cast<const char*>(s.w.data()), kHidden * sizeof(float));
        }
        RANK_OK(ecclLogTruncate(comm, kCheckpoint + 1), comm);  // the checkpoint is durable
      }
      if (stage == 1 && it == kKillAfter) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the neighbours read it all
        raise(SIGKILL);
      }
      float loss = stage == 2 ? 1.0f : 0.0f;
      ecclResult_t r = ecclAllReduce(&loss, &loss, 1, ecclFloat32, ecclSum, comm, nullptr);
      if (r == ecclSuccess) continue;
      RANK_CHECK(it == kKillAfter, "a failure at iteration " + std::to_string(it));
      RANK_OK(ecclCommRecover(comm, ecclRecoverReplace), comm);
      // Bad input first: each is a clear error and sends nothing.
      RANK_CHECK(ecclLogReplay(comm, 1, 1, kKillAfter) == ecclInvalidUsage, "replay of a truncated range");
      RANK_CHECK(std::string(ecclGetLastError(comm)).find("truncated") != std::string::npos, ecclGetLastError(comm));
      RANK_CHECK(ecclLogReplay(comm, 2 - stage, kCheckpoint + 1, kKillAfter) == ecclInvalidArgument,
                 "replay to a peer that is not logged");
      RANK_CHECK(std::string(ecclGetLastError(comm)).find("not logged") != std::string::npos, ecclGetLastError(comm));
      ecclLogStats_t st{};
      st.size = sizeof(st);
      RANK_OK(ecclLogStats(comm, &st), comm);
      RANK_CHECK(st.records == uint64_t(kMicro * (kKillAfter - kCheckpoint)) && st.oldestIteration == kCheckpoint + 1 &&
                     st.newestIteration == kKillAfter && st.gaps == 0,
                 "log stats: " + std::to_string(st.records) + " records, iterations " +
                     std::to_string(st.oldestIteration) + ".." + std::to_string(st.newestIteration));
      RANK_OK(ecclLogReplay(comm, 1, kCheckpoint + 1, kKillAfter), comm);
      std::vector<uint32_t> recomputed(fromStage1.size());
      RANK_OK(ecclRecv(recomputed.data(), recomputed.size(), ecclUint32, 1, comm, nullptr), comm);
      RANK_CHECK(recomputed == fromStage1, "the replacement's recomputed outputs differ from the original's");
      r = ecclAllReduce(&loss, &loss, 1, ecclFloat32, ecclSum, comm, nullptr);
      RANK_OK(r, comm);
    }
    const int perMicro = stage == 2 ? 1 : 2;  // forward and backward; the last stage fuses them
    RANK_CHECK(s.computeCalls == perMicro * kIters * kMicro, "stage " + std::to_string(stage) + " recomputed (" +
                                                      std::to_string(s.computeCalls) + " compute calls)");
    RANK_CHECK(std::memcmp(s.w.data(), ref[stage].w.data(), kHidden * sizeof(float)) == 0,
               "stage " + std::to_string(stage) + "'s final weights differ from the failure-free run");
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(90));
  for (size_t r = 0; r < outcomes.size(); ++r) {
    if (r == 1) EXPECT_TRUE(!outcomes[r].exited && outcomes[r].signal == SIGKILL) << describe(outcomes);
    else EXPECT_TRUE(outcomes[r].exited && outcomes[r].exitCode == 0) << describe(outcomes);
  }
}

TEST_F(PipelineLog, ACorruptedRecordFailsItsReplayedReceiveAndOnlyThat) {
  ProcessGroup group(2, [](int rank, int n, const ecclUniqueId& id) {
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, n, id, rank), nullptr);
    if (rank == 0) {
      ecclLogConfig_t cfg{};
      cfg.size = sizeof(cfg);
      cfg.capacityBytes = 1 << 20;
      RANK_OK(ecclLogConfigure(comm, &cfg), comm);
    }
    std::vector<int32_t> v(1000);
    for (int m = 0; m < 3; ++m) {
      if (rank == 0) {
        std::fill(v.begin(), v.end(), m);
        RANK_OK(ecclLogSetTag(comm, 7, m), comm);
        RANK_OK(ecclSend(v.data(), v.size(), ecclInt32, 1, comm, nullptr), comm);
      } else {
        RANK_OK(ecclRecv(v.data(), v.size(), ecclInt32, 0, comm, nullptr), comm);
      }
    }
    if (rank == 0) {
      ecclLogRecord_t rec{};
      rec.size = sizeof(rec);
      std::vector<int32_t> copy(1000);
      RANK_OK(ecclLogRead(comm, 1, 1, &rec, copy.data(), copy.size() * 4), comm);
      RANK_CHECK(rec.microbatch == 1 && rec.count == 1000 && copy[5] == 1 && rec.crc32c == crc32c(copy.data(), 4000),
                 "ecclLogRead returned the wrong record");
      // Damage record 1 in the log (what a bit flip in host memory does).
      const uint8_t* payload = nullptr;
      eccl::log::LogStore* store = comm->impl->logStoreForTesting();
      store->read(1, 1, &payload);
      const_cast<uint8_t*>(payload)[17] ^= 0x40;
      RANK_OK(ecclLogReplay(comm, 1, 7, 7), comm);
    } else {
      for (int m = 0; m < 3; ++m) {
        ecclResult_t r = ecclRecv(v.data(), v.size(), ecclInt32, 0, comm, nullptr);
        if (m == 1) {
          RANK_CHECK(r != ecclSuccess, "a corrupted record was accepted");
          RANK_CHECK(std::string(ecclGetLastError(comm)).find("failed its checksum") != std::string::npos,
                     ecclGetLastError(comm));
        } else {
          RANK_OK(r, comm);
          RANK_CHECK(v[999] == m, "replayed record " + std::to_string(m) + " has the wrong data");
        }
      }
    }
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

}  // namespace
}  // namespace eccl::test
