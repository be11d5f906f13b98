// A standby's sandbox: before it has a rank it runs the application's step
// (every collective, send and receive) as rank 1 of 3, each call checked as
// for a rank and completed locally with outputs of the right size, without
// a byte on the network, while the job trains. Rank 1 is then killed; the
// survivors' recovery promotes the standby, which ends the sandbox, and the
// same handle runs real collectives with them. Bad calls in the sandbox are
// the errors a rank would get; a rank cannot enter it.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "api/guard.h"
#include "tests/support/host_cuda/host_cuda.h"
#include "tests/support/multiproc.h"

namespace eccl::test {
namespace {

constexpr int kRanks = 3, kSandboxRank = 1, kCount = 1000;

void setJobEnvironment() {
  setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  setenv("ECCL_TIMEOUT_MS", "15000", 1);
  setenv("ECCL_HEARTBEAT_MS", "100", 1);
}

// Once rank 1's place is taken (a survivor after its recovery, the
// standby after its promotion): every rank adds rank + 1, for real.
void realAllReduceThenDestroy(ecclComm_t comm, int rank, const std::string& what) {
  float v = float(rank + 1);
  RANK_OK(ecclAllReduce(&v, &v, 1, ecclFloat32, ecclSum, comm, nullptr), comm);
  RANK_CHECK(v == 6.0f, what + std::to_string(v));
  RANK_OK(ecclCommDestroy(comm), comm);
}

void expectOnlyTheSandboxRankKilled(const std::vector<RankOutcome>& outcomes) {
  for (int r = 0; r <= kRanks; ++r) {
    const auto& o = outcomes[static_cast<size_t>(r)];
    if (r == kSandboxRank) EXPECT_TRUE(!o.exited && o.signal == SIGKILL) << describe(outcomes);
    else EXPECT_TRUE(o.exited && o.exitCode == 0) << describe(outcomes);
  }
}

// One "training step" in the sandbox; checks every output.
void sandboxStep(ecclComm_t comm, int step) {
  const int n = kRanks, r = kSandboxRank;
  std::vector<float> in(kCount * n), out(kCount * n, -1.0f);
  for (size_t i = 0; i < in.size(); ++i) in[i] = float(i % 97) + float(step);
  RANK_OK(ecclAllReduce(in.data(), out.data(), kCount, ecclFloat32, ecclSum, comm, nullptr), comm);
  RANK_CHECK(std::memcmp(out.data(), in.data(), kCount * sizeof(float)) == 0, "allreduce: not its own input");
  RANK_OK(ecclAllGather(in.data(), out.data(), kCount, ecclFloat32, comm, nullptr), comm);
  for (int b = 0; b < n; ++b)
    for (int i = 0; i < kCount; ++i)
      RANK_CHECK(out[b * kCount + i] == (b == r ? in[i] : 0.0f), "allgather block " + std::to_string(b));
  RANK_OK(ecclReduceScatter(in.data(), out.data(), kCount, ecclFloat32, ecclSum, comm, nullptr), comm);
  RANK_CHECK(std::memcmp(out.data(), in.data() + r * kCount, kCount * sizeof(float)) == 0, "reducescatter");
  RANK_OK(ecclBroadcast(in.data(), out.data(), kCount, ecclFloat32, 0, comm, nullptr), comm);
  RANK_CHECK(out[0] == 0.0f && out[kCount - 1] == 0.0f, "broadcast from another rank: not zeros");
  RANK_OK(ecclBroadcast(in.data(), out.data(), kCount, ecclFloat32, r, comm, nullptr), comm);
  RANK_CHECK(out[5] == in[5], "broadcast from itself");
  std::fill(out.begin(), out.end(), -1.0f);
  RANK_OK(ecclAllToAll(in.data(), out.data(), kCount, ecclFloat32, comm, nullptr), comm);
  for (int b = 0; b < n; ++b)
    RANK_CHECK(out[b * kCount + 3] == (b == r ? in[b * kCount + 3] : 0.0f), "alltoall block " + std::to_string(b));
  std::vector<float> peer(kCount, 7.0f);
  RANK_OK(ecclGroupStart(), comm);
  RANK_OK(ecclSend(in.data(), kCount, ecclFloat32, 0, comm, nullptr), comm);
  RANK_OK(ecclRecv(peer.data(), kCount, ecclFloat32, 2, comm, nullptr), comm);
  RANK_OK(ecclGroupEnd(), comm);
  RANK_CHECK(peer[0] == 0.0f && peer[kCount - 1] == 0.0f, "a receive in the sandbox is not zeros");
  RANK_OK(ecclBarrier(comm), comm);
  // The checks a rank gets.
  RANK_CHECK(ecclBroadcast(in.data(), out.data(), kCount, ecclFloat32, 5, comm, nullptr) == ecclInvalidArgument,
             "a root outside the group");
  RANK_CHECK(ecclAllReduce(nullptr, out.data(), kCount, ecclFloat32, ecclSum, comm, nullptr) == ecclInvalidArgument,
             "a NULL buffer");
}

TEST(Sandbox, AStandbyTrainsLocallyThenTheSameHandleBecomesTheRank) {
  setenv("ECCL_CUDA_DRIVER", ECCL_HOST_CUDA, 1);
  setJobEnvironment();
  ReadyFiles ready;
  const std::string dir = ready.dir;
  ProcessGroup group(kRanks + 1, [dir](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    if (index == kRanks) {
      RANK_OK(ecclCommRegisterStandby(&comm, id, nullptr), nullptr);
      float x = 1;
      RANK_CHECK(ecclAllReduce(&x, &x, 1, ecclFloat32, ecclSum, comm, nullptr) == ecclInvalidUsage,
                 "a standby outside the sandbox ran a collective");
      RANK_OK(ecclCommSandbox(comm, kRanks, kSandboxRank), comm);
      int n = 0, r = -1;
      RANK_OK(ecclCommCount(comm, &n), comm);
      RANK_OK(ecclCommUserRank(comm, &r), comm);
      RANK_CHECK(n == kRanks && r == kSandboxRank, "the sandbox says rank " + std::to_string(r) + " of " + std::to_string(n));
      // Device buffers take the stream path, which ends in the same calls
      // (the suite's host emulation of the CUDA driver stands in for a GPU).
      {
        void* stream = hostCudaStreamCreate();
        auto* devIn = static_cast<float*>(hostCudaMalloc(kCount * sizeof(float)));
        auto* devOut = static_cast<float*>(hostCudaMalloc(kCount * sizeof(float)));
        for (int i = 0; i < kCount; ++i) devIn[i] = float(i), devOut[i] = -1.0f;
        RANK_OK(ecclAllReduce(devIn, devOut, kCount, ecclFloat32, ecclSum, comm, stream), comm);
        RANK_CHECK(hostCudaStreamSynchronize(stream) == 0, "stream");
        RANK_CHECK(devOut[0] == 0.0f && devOut[kCount - 1] == float(kCount - 1), "a device allreduce in the sandbox");
        hostCudaFree(devIn);
        hostCudaFree(devOut);
        hostCudaStreamDestroy(stream);
      }
      int steps = 0;
      ecclResult_t promoted = ecclTimeout;
      transport::DeviceStats during;
      while (promoted == ecclTimeout) {
        sandboxStep(comm, steps++);
        during = comm->impl->device().stats();  // after the step, before a promotion
        if (steps == 3) ReadyFiles::mark(dir, kRanks);  // warm: the job may go on
        promoted = ecclCommAwaitPromotion(comm, 1);
      }
      RANK_OK(promoted, comm);
      RANK_CHECK(steps >= 3, "steps " + std::to_string(steps));
      RANK_OK(ecclCommUserRank(comm, &r), comm);
      RANK_CHECK(r == kSandboxRank, "promoted to rank " + std::to_string(r));
      // What the sandbox did never reached the network: before the
      // promotion the standby had no connection and sent nothing.
      RANK_CHECK(during.bytesSent == 0 && during.bytesReceived == 0 && during.connectionsOpened == 0,
                 "the sandbox moved bytes: sent " + std::to_string(during.bytesSent));
      realAllReduceThenDestroy(comm, r, "a real allreduce after the sandbox gave ");
      return;
    }
    RANK_OK(ecclCommInitRank(&comm, kRanks, id, index), nullptr);
    RANK_CHECK(ecclCommSandbox(comm, kRanks, 0) == ecclInvalidArgument, "a rank entered the sandbox");
    float v = 1;
    int step = 0;
    for (;; ++step) {
      ecclResult_t rc = ecclAllReduce(&v, &v, 1, ecclFloat32, ecclMax, comm, nullptr);
      if (rc != ecclSuccess) break;
      if (index == kSandboxRank && step == 20 && std::filesystem::exists(dir + "/" + std::to_string(kRanks)))
        raise(SIGKILL);
      if (index == kSandboxRank && step == 20) --step;  // wait for the standby to be warm
      RANK_CHECK(step < 100000, "rank 1 never died");
    }
    RANK_OK(ecclCommRecover(comm, ecclRecoverReplace), comm);
    realAllReduceThenDestroy(comm, index, "after the replacement: ");
  });
  expectOnlyTheSandboxRankKilled(group.wait(std::chrono::seconds(90)));
}

// A stream-ordered call in the sandbox, its stream still busy, then the
// standby leaves the sandbox: the call answers in the sandbox, as it was
// made there (before the caller role, ecclCommSandbox changed the sandbox
// while the stream proxy still had the call to run, which then went to the
// network as a standby's and failed).
// The emulation's driver entry point (host_cuda.cc): delays a stream.
extern "C" int cuLaunchHostFunc(void* stream, void (*fn)(void*), void* data);

TEST(Sandbox, ASandboxCallComesAfterTheStreamWorkBeforeIt) {
  setenv("ECCL_CUDA_DRIVER", ECCL_HOST_CUDA, 1);
  setJobEnvironment();
  ReadyFiles ready;
  const std::string dir = ready.dir;
  ProcessGroup group(2, [dir](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    if (index == 0) {
      RANK_OK(ecclCommInitRank(&comm, 1, id, 0), nullptr);
      for (int i = 0; i < 3000 && !std::filesystem::exists(dir + "/1"); ++i) usleep(10 * 1000);
      RANK_CHECK(std::filesystem::exists(dir + "/1"), "the standby never finished");
      RANK_OK(ecclCommDestroy(comm), comm);
      return;
    }
    RANK_OK(ecclCommRegisterStandby(&comm, id, nullptr), nullptr);
    void* stream = hostCudaStreamCreate();
    auto* devIn = static_cast<float*>(hostCudaMalloc(kCount * sizeof(float)));
    auto* devOut = static_cast<float*>(hostCudaMalloc(kCount * sizeof(float)));
    for (int round = 0; round < 3; ++round) {
      for (int i = 0; i < kCount; ++i) devIn[i] = float(i + round), devOut[i] = -1.0f;
      RANK_OK(ecclCommSandbox(comm, kRanks, kSandboxRank), comm);
      RANK_CHECK(cuLaunchHostFunc(stream, [](void*) { usleep(200 * 1000); }, nullptr) == 0, "delaying the stream");
      RANK_OK(ecclAllReduce(devIn, devOut, kCount, ecclFloat32, ecclSum, comm, stream), comm);
      RANK_OK(ecclCommSandbox(comm, 0, 0), comm);
      RANK_CHECK(hostCudaStreamSynchronize(stream) == 0, "stream");
      ecclResult_t async = ecclSuccess;
      RANK_OK(ecclCommGetAsyncError(comm, &async), comm);
      RANK_CHECK(async == ecclSuccess, std::string("the sandboxed call failed: ") + ecclGetLastError(comm));
      RANK_CHECK(devOut[0] == float(round) && devOut[kCount - 1] == float(kCount - 1 + round),
                 "the sandboxed allreduce did not answer with its own input");
    }
    hostCudaFree(devIn);
    hostCudaFree(devOut);
    hostCudaStreamDestroy(stream);
    ReadyFiles::mark(dir, 1);
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

// The step the ranks run in the replay test, `s` its number: rank r's input
// element i is (r + 1) * 1000 + s + i % 13.
float stepInput(int rank, int s, int i) { return float((rank + 1) * 1000 + s + i % 13); }

constexpr int kRecordedCalls = 7;

// The ring exchange of the step: rank r sends its input to r + 1 and
// receives from r - 1.
bool ringExchange(ecclComm_t comm, int rank, const float* send, float* recv) {
  return ecclGroupStart() == ecclSuccess &&
         ecclSend(send, kCount, ecclFloat32, (rank + 1) % kRanks, comm, nullptr) == ecclSuccess &&
         ecclRecv(recv, kCount, ecclFloat32, (rank + kRanks - 1) % kRanks, comm, nullptr) == ecclSuccess &&
         ecclGroupEnd() == ecclSuccess;
}

constexpr int kNothingReplayed = -1, kPartlyReplayed = -2;

uint64_t recordingsReceived(ecclComm_t comm) {
  ecclCommStats_t stats{};
  stats.size = sizeof(stats);
  RANK_OK(ecclCommGetStats(comm, &stats), comm);
  return stats.sandboxRecordingsReceived;
}

// The standby's step as rank r (0 or 1): the ranks' seven calls with two
// more between them that no rank made, and a receive from another peer.
// Returns the step number the replayed outputs come from when rank r's
// recording answered all five of its outputs; kNothingReplayed while they
// are the sandbox's own answers; kPartlyReplayed when fewer were replayed
// (another rank's recording answers only the outputs that do not depend on
// the rank, or the first recording came in mid-step).
int replayedStep(ecclComm_t comm, int r) {
  const int left = (r + kRanks - 1) % kRanks, other = (r + 1) % kRanks;
  std::vector<float> in(kCount * kRanks), out(kCount * kRanks);
  for (int i = 0; i < kCount * kRanks; ++i) in[i] = stepInput(r, 0, i);
  ecclCommStats_t before{}, after{};
  before.size = after.size = sizeof(ecclCommStats_t);
  RANK_OK(ecclCommGetStats(comm, &before), comm);
  RANK_OK(ecclAllReduce(in.data(), out.data(), kCount, ecclFloat32, ecclSum, comm, nullptr), comm);
  // Another rank's sum: 6000 + 3s + 3 (i % 13).
  const int s = int(out[0] - 6000.0f) / 3;
  std::vector<float> sum(out.begin(), out.begin() + kCount);
  RANK_OK(ecclBroadcast(in.data(), out.data(), kCount, ecclFloat32, 0, comm, nullptr), comm);
  std::vector<float> fromRoot(out.begin(), out.begin() + kCount);
  RANK_OK(ecclAllGather(in.data(), out.data(), kCount, ecclFloat32, comm, nullptr), comm);
  std::vector<float> gathered(out);
  RANK_OK(ecclReduceScatter(in.data(), out.data(), kCount, ecclFloat32, ecclSum, comm, nullptr), comm);
  std::vector<float> scattered(out.begin(), out.begin() + kCount);
  // Not recorded: the sandbox's own answers, and the replay stays in step.
  std::vector<float> half(kCount / 2, -1.0f);
  RANK_OK(ecclAllReduce(in.data(), half.data(), kCount / 2, ecclFloat32, ecclSum, comm, nullptr), comm);
  RANK_CHECK(std::memcmp(half.data(), in.data(), half.size() * sizeof(float)) == 0,
             "an allreduce no rank recorded is not the sandbox's own answer");
  std::fill(out.begin(), out.end(), -1.0f);
  RANK_OK(ecclAllToAll(in.data(), out.data(), kCount, ecclFloat32, comm, nullptr), comm);
  RANK_CHECK(out[other * kCount] == 0.0f && out[r * kCount + 1] == in[r * kCount + 1], "an unrecorded alltoall");
  std::vector<float> fromLeft(kCount, -1.0f);
  RANK_CHECK(ringExchange(comm, r, in.data(), fromLeft.data()), "the ring exchange in the sandbox");
  RANK_OK(ecclBarrier(comm), comm);
  std::vector<float> peer(kCount, 7.0f);
  RANK_OK(ecclRecv(peer.data(), kCount, ecclFloat32, 2, comm, nullptr), comm);
  RANK_CHECK(peer[0] == 0.0f, "a receive in the sandbox is not zeros");
  RANK_OK(ecclCommGetStats(comm, &after), comm);
  const uint64_t replayed = after.sandboxReplayed - before.sandboxReplayed;
  if (replayed == 0) {
    RANK_CHECK(std::memcmp(sum.data(), in.data(), sum.size() * sizeof(float)) == 0, "allreduce: not its own input");
    RANK_CHECK(fromLeft[0] == 0.0f && fromLeft[kCount - 1] == 0.0f, "a receive in the sandbox is not zeros");
    return kNothingReplayed;
  }
  if (replayed != 5) return kPartlyReplayed;
  RANK_CHECK(s >= 0 && after.sandboxRecordingsReceived >= 1, "replayed, with no recording taken in");
  for (int i = 0; i < kCount; ++i) {
    float want = 0;
    for (int k = 0; k < kRanks; ++k) want += stepInput(k, s, i);
    RANK_CHECK(sum[i] == want, "replayed allreduce element " + std::to_string(i));
    RANK_CHECK(fromRoot[i] == stepInput(0, s, i), "replayed broadcast element " + std::to_string(i));
    for (int b = 0; b < kRanks; ++b)
      RANK_CHECK(gathered[b * kCount + i] == stepInput(b, s, i), "replayed allgather block " + std::to_string(b));
    float block = 0;
    for (int k = 0; k < kRanks; ++k) block += stepInput(k, s, r * kCount + i);
    RANK_CHECK(scattered[i] == block, "replayed reducescatter element " + std::to_string(i));
    RANK_CHECK(fromLeft[i] == stepInput(left, s, i),
               "replayed receive from rank " + std::to_string(left) + ", element " + std::to_string(i));
  }
  return s;
}

TEST(Sandbox, AnEagerStandbyAnswersWithTheOutputsARankRecordedForIt) {
  setJobEnvironment();
  setenv("ECCL_PREPARE", "eager", 1);
  ReadyFiles ready;
  const std::string dir = ready.dir;
  ProcessGroup group(kRanks + 1, [dir](int index, int, const ecclUniqueId& id) {
    ecclComm_t comm;
    const std::string warm = dir + "/" + std::to_string(kRanks);
    if (index == kRanks) {
      RANK_OK(ecclCommRegisterStandby(&comm, id, nullptr), nullptr);
      RANK_CHECK(ecclCommSandboxRecord(comm, 5) == ecclInvalidArgument, "a standby recorded calls");
      RANK_OK(ecclCommSandbox(comm, kRanks, kSandboxRank), comm);
      // As rank 1 until a step replays rank 1's recording; then as rank 0
      // until one replays rank 0's (ranks 0 and 1 both record); then as
      // rank 1 again until a recording newer than the first is replayed
      // (leaving the sandbox withdraws the feed's receives; the
      // recordings after them still arrive).
      int phase = 0, firstReplay = -1, replayedFrom = -1;
      uint64_t receivedThen = 0;
      bool replayedInPhase = false, warm = false;
      const auto giveUp = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      ecclResult_t promoted = ecclTimeout;
      while (promoted == ecclTimeout) {
        const int asRank = phase == 1 ? 0 : kSandboxRank;
        int s = replayedStep(comm, asRank);
        // Rank 0 records more often than rank 1: once the sandbox rank's
        // own recording came, every step is answered by its newest.
        RANK_CHECK(!replayedInPhase || s >= 0,
                   "as rank " + std::to_string(asRank) + ", after a replay of its own recording a step was answered " +
                       (s == kNothingReplayed ? "locally" : "by another rank's recording"));
        replayedInPhase |= s >= 0;
        if (s >= 0 && phase < 2) {
          if (phase == 0) firstReplay = s;
          phase++;
          replayedInPhase = false;
          RANK_OK(ecclCommSandbox(comm, 0, 0), comm);
          RANK_OK(ecclCommSandbox(comm, kRanks, phase == 1 ? 0 : kSandboxRank), comm);
        } else if (phase == 2 && s > firstReplay && replayedFrom < 0) {
          replayedFrom = s;
          receivedThen = recordingsReceived(comm);
        } else if (phase == 2 && replayedFrom >= 0 && !warm && recordingsReceived(comm) >= receivedThen + 2) {
          // Rank 0's later recordings came in and rank 1's still answered.
          warm = true;
          const transport::DeviceStats d = comm->impl->device().stats();
          // Recordings came in; the sandbox sent nothing.
          RANK_CHECK(d.bytesSent == 0 && d.bytesReceived > 0,
                     "the sandbox sent " + std::to_string(d.bytesSent) + " bytes");
          ReadyFiles::mark(dir, kRanks);
        }
        RANK_CHECK(std::chrono::steady_clock::now() < giveUp,
                   replayedFrom < 0 ? "no recording replayed in phase " + std::to_string(phase)
                   : warm           ? std::string("replayed, but never promoted")
                                    : std::string("no later recordings came in"));
        promoted = ecclCommAwaitPromotion(comm, 1);
      }
      RANK_OK(promoted, comm);
      RANK_CHECK(replayedFrom >= 0, "promoted before any recording was replayed");
      realAllReduceThenDestroy(comm, kSandboxRank, "a real allreduce after the sandbox gave ");
      return;
    }
    RANK_OK(ecclCommInitRank(&comm, kRanks, id, index), nullptr);
    RANK_CHECK(ecclCommSandboxRecord(comm, -1) == ecclInvalidArgument, "a negative call count");
    const auto giveUp = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    int s = 0;
    for (;; ++s) {
      RANK_CHECK(std::chrono::steady_clock::now() < giveUp, "the standby never replayed a recording");
      const bool standbyWarm = std::filesystem::exists(warm);
      if (index == kSandboxRank && standbyWarm) raise(SIGKILL);
      // Rank 1 records a step now and then until the standby replays one;
      // rank 0 records more often, and its recordings do not displace
      // rank 1's in the standby sandboxed as rank 1.
      if ((index == kSandboxRank && s % 20 == 0) || (index == 0 && s % 3 == 1))
        RANK_OK(ecclCommSandboxRecord(comm, kRecordedCalls), comm);
      std::vector<float> in(kCount * kRanks), out(kCount * kRanks);
      for (int i = 0; i < kCount * kRanks; ++i) in[i] = stepInput(index, s, i);
      // Rank 1 dies between steps, but a survivor may still be in the last
      // call of the step before (a barrier's release in flight): any call
      // may report it.
      bool ok = ecclAllReduce(in.data(), out.data(), kCount, ecclFloat32, ecclSum, comm, nullptr) == ecclSuccess &&
                ecclBroadcast(in.data(), out.data(), kCount, ecclFloat32, 0, comm, nullptr) == ecclSuccess &&
                ecclAllGather(in.data(), out.data(), kCount, ecclFloat32, comm, nullptr) == ecclSuccess &&
                ecclReduceScatter(in.data(), out.data(), kCount, ecclFloat32, ecclSum, comm, nullptr) == ecclSuccess &&
                ringExchange(comm, index, in.data(), out.data()) && ecclBarrier(comm) == ecclSuccess;
      if (!ok) break;
      usleep(1000);
    }
    RANK_OK(ecclCommRecover(comm, ecclRecoverReplace), comm);
    realAllReduceThenDestroy(comm, index, "after the replacement: ");
  });
  expectOnlyTheSandboxRankKilled(group.wait(std::chrono::seconds(90)));
}

}  // namespace
}  // namespace eccl::test
