// The stream path for device buffers (src/gpu, src/api/stream_calls.cc,
// src/api/moe_api.cc) across real processes, run on the host emulation of
// the CUDA driver (tests/support/host_cuda), so it runs in every build:
// every collective against the host path in several chunks, stream order,
// groups over two streams with a send to self, the MoE dispatch and
// combine, and a peer dying under a stream op. tests/cuda/ runs the same
// on a real GPU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "tests/support/host_cuda/host_cuda.h"
#include "tests/support/device_cases.h"
#include "tests/support/multiproc.h"

namespace eccl::test {
namespace {

// Device memory of the emulation, freed with the test.
struct DeviceBuffer {
  explicit DeviceBuffer(size_t bytes) : p(hostCudaMalloc(bytes)), bytes(bytes) {}
  ~DeviceBuffer() { hostCudaFree(p); }
  float* f() const { return static_cast<float*>(p); }
  void* p;
  size_t bytes;
};

// Reads device memory after the stream's work (the emulation's device memory is host memory).
std::vector<float> read(void* stream, const DeviceBuffer& d, size_t count) {
  hostCudaStreamSynchronize(stream);
  return std::vector<float>(d.f(), d.f() + count);
}

#define SAME(got, want, what) \
  RANK_CHECK((got).size() >= (want).size() && std::equal((want).begin(), (want).end(), (got).begin()), what)

void checkNoAsyncError(ecclComm_t comm, const std::string& what) {
  ecclResult_t async = ecclSuccess;
  RANK_OK(ecclCommGetAsyncError(comm, &async), comm);
  RANK_CHECK(async == ecclSuccess, what + ": async error " + ecclGetLastError(comm));
}

class StreamPath : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    setenv("ECCL_CUDA_DRIVER", ECCL_HOST_CUDA, 1);
    setenv("ECCL_SOCKET_IFNAME", "lo", 1);
    setenv("ECCL_GPU_CHUNK_BYTES", "4096", 1);  // the smallest chunk: most ops run in several
  }
};

TEST_P(StreamPath, EveryCollectiveMatchesTheHostPath) {
  ProcessGroup group(GetParam(), [](int rank, int n, const ecclUniqueId& id) {
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, n, id, rank), nullptr);
    void* stream = hostCudaStreamCreate();
    for (size_t count : {size_t{0}, size_t{1}, size_t{1000}, size_t{5003}}) {
      const size_t bytes = count * sizeof(float);
      auto in = pattern(rank, count);
      std::vector<float> want(count * n);
      DeviceBuffer dIn(bytes), dOut(bytes * n);
      if (bytes) std::memcpy(dIn.p, in.data(), bytes);
      auto check = [&](const char* what, size_t elems) {
        auto got = read(stream, dOut, elems);
        want.resize(elems);
        SAME(got, want, std::string(what) + " differs from the host path at count " + std::to_string(count));
        want.resize(count * n);
        checkNoAsyncError(comm, what);
      };
      RANK_OK(ecclAllReduce(in.data(), want.data(), count, ecclFloat32, ecclSum, comm, nullptr), comm);
      RANK_OK(ecclAllReduce(dIn.p, dOut.p, count, ecclFloat32, ecclSum, comm, stream), comm);
      check("allreduce", count);
      RANK_OK(ecclBroadcast(in.data(), want.data(), count, ecclFloat32, n - 1, comm, nullptr), comm);
      RANK_OK(ecclBroadcast(dIn.p, dOut.p, count, ecclFloat32, n - 1, comm, stream), comm);
      check("broadcast", count);
      // Off the root the output is scratch: the device buffer keeps what it had.
      std::vector<float> before = read(stream, dOut, count);
      RANK_OK(ecclReduce(in.data(), want.data(), count, ecclFloat32, ecclMax, 0, comm, nullptr), comm);
      RANK_OK(ecclReduce(dIn.p, rank == 0 ? dOut.p : nullptr, count, ecclFloat32, ecclMax, 0, comm, stream), comm);
      if (rank != 0) want.assign(before.begin(), before.end());
      check("reduce", count);
      if (count == 0) continue;
      RANK_OK(ecclAllGather(in.data(), want.data(), count, ecclFloat32, comm, nullptr), comm);
      RANK_OK(ecclAllGather(dIn.p, dOut.p, count, ecclFloat32, comm, stream), comm);
      check("allgather", count * n);
      const size_t part = count / n;
      if (part == 0) continue;
      RANK_OK(ecclReduceScatter(in.data(), want.data(), part, ecclFloat32, ecclSum, comm, nullptr), comm);
      RANK_OK(ecclReduceScatter(dIn.p, dOut.p, part, ecclFloat32, ecclSum, comm, stream), comm);
      check("reducescatter", part);
      RANK_OK(ecclAllToAll(in.data(), want.data(), part, ecclFloat32, comm, nullptr), comm);
      RANK_OK(ecclAllToAll(dIn.p, dOut.p, part, ecclFloat32, comm, stream), comm);
      check("alltoall", part * n);
      // Uneven: rank r sends j + 1 elements to rank j.
      std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
      for (int j = 0; j < n; ++j) sc[j] = j + 1, sd[j] = j * 3, rc[j] = rank + 1, rd[j] = j * (rank + 2);
      const size_t outElems = rd[n - 1] + rc[n - 1];
      std::fill(want.begin(), want.end(), 0.0f);
      std::memset(dOut.p, 0, dOut.bytes);
      RANK_OK(ecclAllToAllv(in.data(), sc.data(), sd.data(), want.data(), rc.data(), rd.data(), ecclFloat32, comm,
                            nullptr), comm);
      RANK_OK(ecclAllToAllv(dIn.p, sc.data(), sd.data(), dOut.p, rc.data(), rd.data(), ecclFloat32, comm, stream),
              comm);
      std::fill(sc.begin(), sc.end(), 0);  // the call copied the counts
      check("alltoallv", outElems);
    }
    hostCudaStreamDestroy(stream);
    RANK_OK(ecclCommDestroy(comm), nullptr);
  });
  auto outcomes = group.wait(std::chrono::seconds(120));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

// The call only enqueues: the stream's earlier work is the op's input, its
// later work sees the result, and a host call after stream work runs after
// it on every rank. A point-to-point pair runs on the stream too.
TEST_P(StreamPath, StreamOrderIsKept) {
  ProcessGroup group(GetParam(), [](int rank, int n, const ecclUniqueId& id) {
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, n, id, rank), nullptr);
    void* stream = hostCudaStreamCreate();
    void* other = hostCudaStreamCreate();
    const size_t count = 20000;
    DeviceBuffer d(count * sizeof(float));
    std::vector<float> ones(count, 1.0f), back(count, 0.0f);
    RANK_CHECK(hostCudaMemcpyAsync(d.p, ones.data(), count * sizeof(float), stream) == 0, "enqueueing a copy");
    RANK_OK(ecclAllReduce(d.p, d.p, count, ecclFloat32, ecclSum, comm, stream), comm);
    RANK_CHECK(hostCudaMemcpyAsync(back.data(), d.p, count * sizeof(float), stream) == 0, "enqueueing a copy");
    hostCudaStreamSynchronize(stream);
    RANK_CHECK(std::all_of(back.begin(), back.end(), [&](float v) { return v == static_cast<float>(n); }),
               "the allreduce did not see the stream's earlier copy, or the later copy did not see it");
    RANK_OK(ecclAllReduce(d.p, d.p, count, ecclFloat32, ecclSum, comm, other), comm);
    float x = 1, y = 0;
    RANK_OK(ecclAllReduce(&x, &y, 1, ecclFloat32, ecclSum, comm, nullptr), comm);
    RANK_CHECK(y == static_cast<float>(n), "host allreduce after stream work");
    RANK_CHECK(read(other, d, 1)[0] == static_cast<float>(n * n), "second stream allreduce");
    if (rank == 0) RANK_OK(ecclSend(d.p, count, ecclFloat32, 1, comm, stream), comm);
    if (rank == 1) {
      std::memset(d.p, 0, d.bytes);
      RANK_OK(ecclRecv(d.p, count, ecclFloat32, 0, comm, stream), comm);
      RANK_CHECK(read(stream, d, count)[count - 1] == static_cast<float>(n * n), "received on the stream");
    }
    hostCudaStreamSynchronize(stream);
    checkNoAsyncError(comm, "stream order");
    hostCudaStreamDestroy(stream);
    hostCudaStreamDestroy(other);
    RANK_OK(ecclCommDestroy(comm), nullptr);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

extern "C" int cuLaunchHostFunc(void* stream, void (*fn)(void*), void* data);

// Calls that are not stream-ordered (a barrier, non-blocking point to
// point, the boundary log's tag) run after the communicator's stream work,
// even where one rank's stream is late: its proxy thread and its caller
// never use the communicator at once, and both ranks see one order.
TEST_P(StreamPath, HostCallsRunAfterTheStreamWorkBeforeThem) {
  ProcessGroup group(GetParam(), [](int rank, int n, const ecclUniqueId& id) {
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, n, id, rank), nullptr);
    void* stream = hostCudaStreamCreate();
    const size_t count = 10000;
    DeviceBuffer d(count * sizeof(float));
    for (int round = 0; round < 3; ++round) {
      std::fill(d.f(), d.f() + count, 1.0f);
      if (rank == round % n)  // this rank's stream gets to the op late
        RANK_CHECK(cuLaunchHostFunc(stream, [](void*) { usleep(200 * 1000); }, nullptr) == 0, "delaying the stream");
      RANK_OK(ecclAllReduce(d.p, d.p, count, ecclFloat32, ecclSum, comm, stream), comm);
      RANK_OK(ecclBarrier(comm), comm);
      int mine = rank, theirs = -1;
      ecclRequest_t send, recv;
      RANK_OK(ecclIrecv(&theirs, 1, ecclInt32, (rank + n - 1) % n, comm, &recv), comm);
      RANK_OK(ecclIsend(&mine, 1, ecclInt32, (rank + 1) % n, comm, &send), comm);
      RANK_OK(ecclWait(send), comm);
      RANK_OK(ecclWait(recv), comm);
      RANK_OK(ecclRequestFree(send), comm);
      RANK_OK(ecclRequestFree(recv), comm);
      RANK_CHECK(theirs == (rank + n - 1) % n, "non-blocking receive after stream work");
      RANK_CHECK(read(stream, d, count)[count - 1] == static_cast<float>(n), "the stream allreduce");
    }
    ecclRequest_t refused = nullptr;
    RANK_CHECK(ecclIsend(d.p, 1, ecclFloat32, (rank + 1) % n, comm, &refused) == ecclInvalidArgument,
               "ecclIsend refuses device memory");
    checkNoAsyncError(comm, "host calls after stream work");
    hostCudaStreamDestroy(stream);
    RANK_OK(ecclCommDestroy(comm), nullptr);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

// A stream-ordered receive, its stream still busy, then a probe on the
// host: the probe looks past the message the receive takes, as it would
// had the receive been a host call (without the caller role the probe read
// the receive sequence while the proxy thread moved it, and named the
// stream's message).
TEST_P(StreamPath, AProbeComesAfterTheStreamOrderedReceiveBeforeIt) {
  ProcessGroup group(GetParam(), [](int rank, int n, const ecclUniqueId& id) {
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, n, id, rank), nullptr);
    const size_t count = 3000;
    int small[7] = {1, 2, 3, 4, 5, 6, 7};
    for (int round = 0; round < 3 && rank < 2; ++round) {
      if (rank == 0) {
        std::vector<float> big(count, float(round));
        RANK_OK(ecclSend(big.data(), count, ecclFloat32, 1, comm, nullptr), comm);
        RANK_OK(ecclSend(small, 7, ecclInt32, 1, comm, nullptr), comm);
        continue;
      }
      void* stream = hostCudaStreamCreate();
      DeviceBuffer d(count * sizeof(float));
      RANK_CHECK(cuLaunchHostFunc(stream, [](void*) { usleep(200 * 1000); }, nullptr) == 0, "delaying the stream");
      RANK_OK(ecclRecv(d.p, count, ecclFloat32, 0, comm, stream), comm);
      int peer = 0, arrived = 0;
      size_t bytes = 0;
      for (int i = 0; i < 5000 && !arrived; ++i) {
        peer = 0;
        RANK_OK(ecclIprobe(&peer, &arrived, &bytes, comm), comm);
        if (!arrived) usleep(1000);
      }
      RANK_CHECK(arrived && bytes == sizeof(small),
                 "the probe saw " + std::to_string(bytes) + " bytes, not the 28 after the stream's receive");
      int got[7] = {};
      RANK_OK(ecclRecv(got, 7, ecclInt32, 0, comm, nullptr), comm);
      RANK_CHECK(got[6] == 7, "the small message");
      RANK_CHECK(read(stream, d, count)[count - 1] == float(round), "the stream's receive");
      hostCudaStreamDestroy(stream);
    }
    checkNoAsyncError(comm, "probe after a stream receive");
    RANK_OK(ecclBarrier(comm), comm);
    RANK_OK(ecclCommDestroy(comm), nullptr);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

// ecclTest and ecclWait during a recording of sandbox calls: the stream's
// recorded collective and the caller's receive both touch the recording,
// and the caller's now come after the stream work before it. Only the
// results can be checked: TSan does not see the two threads share the
// recording without the caller role, because both also take the device's
// lock, which orders them for it (the clang analysis is what rejects it).
TEST_P(StreamPath, TestAndWaitDuringARecordingComeAfterTheStreamWork) {
  ProcessGroup group(GetParam(), [](int rank, int n, const ecclUniqueId& id) {
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, n, id, rank), nullptr);
    void* stream = hostCudaStreamCreate();
    const size_t count = 5000;
    DeviceBuffer d(count * sizeof(float));
    RANK_OK(ecclCommSandboxRecord(comm, 16), comm);
    for (int round = 0; round < 3; ++round) {
      std::fill(d.f(), d.f() + count, 1.0f);
      int mine = rank + round, theirs = -1;
      ecclRequest_t send, recv;
      RANK_OK(ecclIrecv(&theirs, 1, ecclInt32, (rank + n - 1) % n, comm, &recv), comm);
      RANK_CHECK(cuLaunchHostFunc(stream, [](void*) { usleep(100 * 1000); }, nullptr) == 0, "delaying the stream");
      RANK_OK(ecclAllReduce(d.p, d.p, count, ecclFloat32, ecclSum, comm, stream), comm);
      int done = 0;
      RANK_OK(ecclTest(recv, &done), comm);
      RANK_OK(ecclIsend(&mine, 1, ecclInt32, (rank + 1) % n, comm, &send), comm);
      RANK_OK(ecclWait(recv), comm);
      RANK_OK(ecclWait(send), comm);
      RANK_OK(ecclRequestFree(send), comm);
      RANK_OK(ecclRequestFree(recv), comm);
      RANK_CHECK(theirs == (rank + n - 1) % n + round, "the receive during the recording");
      RANK_CHECK(read(stream, d, count)[count - 1] == static_cast<float>(n), "the recorded stream allreduce");
    }
    checkNoAsyncError(comm, "test and wait during a recording");
    hostCudaStreamDestroy(stream);
    RANK_OK(ecclCommDestroy(comm), nullptr);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

TEST_P(StreamPath, GroupedCallsRunTogetherOnEveryStreamTheyName) {
  ProcessGroup group(GetParam(), [](int rank, int n, const ecclUniqueId& id) {
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, n, id, rank), nullptr);
    void* sends = hostCudaStreamCreate();
    void* recvs = hostCudaStreamCreate();
    const size_t count = 30000, bytes = count * sizeof(float);
    const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    auto mine = pattern(rank, count), fromPrev = pattern(prev, count);
    DeviceBuffer dIn(bytes), dRing(bytes), dSelf(bytes), dSum(bytes);
    std::memcpy(dIn.p, mine.data(), bytes);
    std::vector<float> sum(count);
    RANK_OK(ecclAllReduce(mine.data(), sum.data(), count, ecclFloat32, ecclSum, comm, nullptr), comm);
    RANK_OK(ecclGroupStart(), nullptr);
    RANK_OK(ecclRecv(dRing.p, count, ecclFloat32, prev, comm, recvs), comm);
    RANK_OK(ecclSend(dIn.p, count, ecclFloat32, next, comm, sends), comm);
    RANK_OK(ecclSend(dIn.p, count, ecclFloat32, rank, comm, sends), comm);
    RANK_OK(ecclRecv(dSelf.p, count, ecclFloat32, rank, comm, recvs), comm);
    RANK_OK(ecclAllReduce(dIn.p, dSum.p, count, ecclFloat32, ecclSum, comm, sends), comm);
    float x = 1, y = 0;
    ecclResult_t mixed = ecclAllReduce(&x, &y, 1, ecclFloat32, ecclSum, comm, nullptr);
    RANK_CHECK(mixed == ecclInvalidUsage, std::string("a host buffer in a group of device calls: ") +
                                              ecclGetErrorString(mixed));
    RANK_OK(ecclGroupEnd(), nullptr);
    // The receives' stream waits for the whole group, sends and all.
    SAME(read(recvs, dRing, count), fromPrev, "grouped ring receive");
    SAME(read(recvs, dSelf, count), mine, "grouped send to self");
    SAME(read(recvs, dSum, count), sum, "grouped allreduce, read on the other stream");
    checkNoAsyncError(comm, "group");
    // Nested groups run at the outermost end.
    std::memset(dRing.p, 0, bytes);
    RANK_OK(ecclGroupStart(), nullptr);
    RANK_OK(ecclGroupStart(), nullptr);
    RANK_OK(ecclSend(dIn.p, count, ecclFloat32, next, comm, sends), comm);
    RANK_OK(ecclGroupEnd(), nullptr);
    RANK_OK(ecclRecv(dRing.p, count, ecclFloat32, prev, comm, sends), comm);
    RANK_OK(ecclGroupEnd(), nullptr);
    SAME(read(sends, dRing, count), fromPrev, "nested group ring");
    hostCudaStreamDestroy(sends);
    hostCudaStreamDestroy(recvs);
    RANK_OK(ecclCommDestroy(comm), nullptr);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

TEST_P(StreamPath, MoeDispatchAndCombineMatchTheHostPath) {
  ProcessGroup group(GetParam(), [](int rank, int n, const ecclUniqueId& id) {
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, n, id, rank), nullptr);
    void* stream = hostCudaStreamCreate();
    void* combineStream = hostCudaStreamCreate();
    MoeCase c = moeCase(rank, n);
    MoeOnHost host = moeOnHost(c, comm);

    DeviceBuffer dX(c.x.size() * 4), dWeights(c.weights.size() * 4), dOut(host.out.size() * 4),
        dRoute(c.route.size() * 4), dReplicas(c.replicas.size() * 4);
    std::memcpy(dX.p, c.x.data(), dX.bytes);
    std::memcpy(dWeights.p, c.weights.data(), dWeights.bytes);
    std::memcpy(dRoute.p, c.route.data(), dRoute.bytes);
    std::memcpy(dReplicas.p, c.replicas.data(), dReplicas.bytes);
    for (bool tableOnDevice : {true, false}) {
      ecclMoePlan_t plan;
      RANK_OK(ecclMoeDispatch(dX.p, static_cast<int32_t*>(dRoute.p), c.tokens, c.topk, c.hidden, ecclFloat32,
                              tableOnDevice ? static_cast<int32_t*>(dReplicas.p) : c.replicas.data(), c.experts, &plan,
                              comm, stream), comm);
      void* dRows = expertRowsLikeTheHost(plan, host, comm);
      hostCudaStreamSynchronize(stream);
      RANK_CHECK(std::memcmp(dRows, host.rows, host.rowCount * c.hidden * sizeof(float)) == 0,
                 "the rows received on the device differ from the host dispatch's");
      // Combined on another stream, which the plan's rows are then freed after.
      std::memset(dOut.p, 0, dOut.bytes);
      RANK_OK(ecclMoeCombine(plan, dRows, dWeights.f(), dOut.p, comm, combineStream), comm);
      RANK_CHECK(ecclMoeCombine(plan, host.rows, c.weights.data(), host.out.data(), comm, nullptr) == ecclInvalidArgument,
                 "a device plan refuses a combine on host buffers");
      SAME(read(combineStream, dOut, host.out.size()), host.out, "the device combine differs from the host combine");
      // The backward's calls: per-choice combine and rows along the plan.
      std::vector<float> perChoice(size_t(c.tokens) * c.topk * c.hidden), along(host.rowCount * c.hidden);
      RANK_OK(ecclMoeCombine(host.plan, host.rows, nullptr, perChoice.data(), comm, nullptr), comm);
      RANK_OK(ecclMoeDispatchAlong(host.plan, perChoice.data(), 1, along.data(), comm, nullptr), comm);
      DeviceBuffer dPer(perChoice.size() * 4), dAlong(along.size() * 4 + 4);
      RANK_OK(ecclMoeCombine(plan, dRows, nullptr, dPer.p, comm, combineStream), comm);
      SAME(read(combineStream, dPer, perChoice.size()), perChoice, "the device per-choice combine differs");
      RANK_OK(ecclMoeDispatchAlong(plan, dPer.p, 1, dAlong.p, comm, combineStream), comm);
      SAME(read(combineStream, dAlong, along.size()), along, "the device rows along the plan differ");
      RANK_OK(ecclMoePlanDestroy(plan), comm);
    }
    hostCudaStreamSynchronize(stream);
    checkNoAsyncError(comm, "moe");
    RANK_OK(ecclMoePlanDestroy(host.plan), comm);
    hostCudaStreamDestroy(stream);
    hostCudaStreamDestroy(combineStream);
    RANK_OK(ecclCommDestroy(comm), nullptr);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

// A peer that dies under a stream op: the op's error arrives through
// ecclCommGetAsyncError, ecclGetLastError names the peer, and the stream is released (its
// later work runs), as NCCL's would be by an abort.
TEST_P(StreamPath, APeerDyingUnderAStreamOpIsAnAsyncErrorAndReleasesTheStream) {
  ProcessGroup group(GetParam(), [](int rank, int n, const ecclUniqueId& id) {
    setenv("ECCL_TIMEOUT_MS", "20000", 1);
    ecclComm_t comm;
    RANK_OK(ecclCommInitRank(&comm, n, id, rank), nullptr);
    if (rank == n - 1) _exit(0);  // gone before the op
    void* stream = hostCudaStreamCreate();
    DeviceBuffer d(4096 * sizeof(float));
    RANK_OK(ecclAllReduce(d.p, d.p, 4096, ecclFloat32, ecclSum, comm, stream), comm);
    int after = 0;
    RANK_CHECK(hostCudaMemcpyAsync(&after, &n, sizeof(int), stream) == 0, "enqueueing a copy");
    hostCudaStreamSynchronize(stream);
    RANK_CHECK(after == n, "the stream's later work ran");
    ecclResult_t async = ecclSuccess;
    RANK_OK(ecclCommGetAsyncError(comm, &async), comm);
    RANK_CHECK(async == ecclRemoteError, std::string("async error: ") + ecclGetErrorString(async));
    std::string why = ecclGetLastError(comm);
    RANK_CHECK(why.find("rank " + std::to_string(n - 1)) != std::string::npos, "the error names the dead rank: " + why);
    hostCudaStreamDestroy(stream);
    ecclCommAbort(comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

INSTANTIATE_TEST_SUITE_P(Ranks, StreamPath, ::testing::Values(2, 3));

}  // namespace
}  // namespace eccl::test
