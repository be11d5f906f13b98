// Collectives on device buffers through the C API, 2 to 4 ranks sharing
// the GPUs present: every result is compared with the same collective on
// host buffers (the CPU reference), and the stream semantics are checked
// (the call returns before the work is done; later work on the stream sees
// the result); snapshots of GPU memory come back intact. Skips with the
// reason where there is no GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "tests/support/device_cases.h"
#include "tests/support/multiproc.h"

namespace eccl::test {
namespace {

// CUDA must not be initialised in the parent of the ranks (a forked child
// cannot use it), so a child answers whether a GPU is there.
bool gpuPresent(std::string* why) {
  pid_t pid = fork();
  if (pid == 0) {
    int n = 0;
    _exit(cudaGetDeviceCount(&n) == cudaSuccess && n > 0 ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  *why = "no CUDA GPU on this machine";
  return false;
}

#define CUDA_OK(call) RANK_CHECK((call) == cudaSuccess, #call)


// Ranks take the GPUs in turn (several share one where there are fewer).
ecclComm_t openOnGpu(int rank, int n, const ecclUniqueId& id) {
  int devices = 0;
  CUDA_OK(cudaGetDeviceCount(&devices));
  CUDA_OK(cudaSetDevice(rank % devices));
  ecclComm_t comm;
  RANK_OK(ecclCommInitRank(&comm, n, id, rank), nullptr);
  return comm;
}

class OnGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpuPresent(&why)) GTEST_SKIP() << why;
    setenv("ECCL_SOCKET_IFNAME", "lo", 1);
  }
};

class DeviceCollectives : public OnGpu, public ::testing::WithParamInterface<int> {};

// Sizes straddle ECCL_GPU_CHUNK_BYTES (64 KiB here) so ops run in several
// chunks with a short last one.
TEST_P(DeviceCollectives, EveryCollectiveMatchesTheHostPath) {
  setenv("ECCL_GPU_CHUNK_BYTES", "65536", 1);
  ProcessGroup group(GetParam(), [](int rank, int n, const ecclUniqueId& id) {
    ecclComm_t comm = openOnGpu(rank, n, id);
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreate(&stream));
    for (size_t count : {size_t{0}, size_t{1}, size_t{1000}, size_t{40000}, size_t{300000}}) {
      const size_t bytes = count * sizeof(float);
      auto in = pattern(rank, count);
      std::vector<float> want(count * n), got(count * n);
      float *dIn, *dOut;
      CUDA_OK(cudaMalloc(&dIn, std::max<size_t>(bytes, 4)));
      CUDA_OK(cudaMalloc(&dOut, std::max<size_t>(bytes * n, 4)));
      CUDA_OK(cudaMemcpy(dIn, in.data(), bytes, cudaMemcpyHostToDevice));
      auto check = [&](const char* what, size_t elems) {
        CUDA_OK(cudaStreamSynchronize(stream));
        CUDA_OK(cudaMemcpy(got.data(), dOut, elems * sizeof(float), cudaMemcpyDeviceToHost));
        RANK_CHECK(std::memcmp(got.data(), want.data(), elems * sizeof(float)) == 0,
                   std::string(what) + " differs from the host path at count " + std::to_string(count));
        ecclResult_t async = ecclSuccess;
        RANK_OK(ecclCommGetAsyncError(comm, &async), comm);
        RANK_CHECK(async == ecclSuccess, std::string(what) + ": async error " + ecclGetLastError(comm));
      };
      RANK_OK(ecclAllReduce(in.data(), want.data(), count, ecclFloat32, ecclSum, comm, nullptr), comm);
      RANK_OK(ecclAllReduce(dIn, dOut, count, ecclFloat32, ecclSum, comm, stream), comm);
      check("allreduce", count);
      RANK_OK(ecclBroadcast(in.data(), want.data(), count, ecclFloat32, n - 1, comm, nullptr), comm);
      RANK_OK(ecclBroadcast(dIn, dOut, count, ecclFloat32, n - 1, comm, stream), comm);
      check("broadcast", count);
      if (count > 0) {
        RANK_OK(ecclAllGather(in.data(), want.data(), count, ecclFloat32, comm, nullptr), comm);
        RANK_OK(ecclAllGather(dIn, dOut, count, ecclFloat32, comm, stream), comm);
        check("allgather", count * n);
        const size_t part = count / n;
        if (part > 0) {
          RANK_OK(ecclReduceScatter(in.data(), want.data(), part, ecclFloat32, ecclMax, comm, nullptr), comm);
          RANK_OK(ecclReduceScatter(dIn, dOut, part, ecclFloat32, ecclMax, comm, stream), comm);
          check("reducescatter", part);
          RANK_OK(ecclAllToAll(in.data(), want.data(), part, ecclFloat32, comm, nullptr), comm);
          RANK_OK(ecclAllToAll(dIn, dOut, part, ecclFloat32, comm, stream), comm);
          check("alltoall", part * n);
        }
      }
      CUDA_OK(cudaFree(dIn));
      CUDA_OK(cudaFree(dOut));
    }
    CUDA_OK(cudaStreamDestroy(stream));
    RANK_OK(ecclCommDestroy(comm), nullptr);
  });
  auto outcomes = group.wait(std::chrono::seconds(120));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

// The call only enqueues: what the stream wrote before it is its input,
// what the stream does after it sees its result, and a host call after
// stream work on the communicator runs after that work on every rank.
TEST_P(DeviceCollectives, StreamOrderIsKept) {
  ProcessGroup group(GetParam(), [](int rank, int n, const ecclUniqueId& id) {
    ecclComm_t comm = openOnGpu(rank, n, id);
    cudaStream_t stream, other;
    CUDA_OK(cudaStreamCreate(&stream));
    CUDA_OK(cudaStreamCreate(&other));
    const size_t count = 1 << 20;
    float *d, *host;
    CUDA_OK(cudaMalloc(&d, count * sizeof(float)));
    CUDA_OK(cudaMallocHost(&host, count * sizeof(float)));
    std::vector<float> ones(count, 1.0f);
    // The input is written on the stream before the allreduce; the result
    // is read on the stream after it.
    CUDA_OK(cudaMemcpyAsync(d, ones.data(), count * sizeof(float), cudaMemcpyHostToDevice, stream));
    RANK_OK(ecclAllReduce(d, d, count, ecclFloat32, ecclSum, comm, stream), comm);
    CUDA_OK(cudaMemcpyAsync(host, d, count * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    for (size_t i = 0; i < count; i += 4099)
      RANK_CHECK(host[i] == static_cast<float>(n), "element " + std::to_string(i) + " is " + std::to_string(host[i]));
    // A host call after stream work runs after it on every rank.
    float x = 1, y = 0;
    RANK_OK(ecclAllReduce(d, d, count, ecclFloat32, ecclSum, comm, other), comm);
    RANK_OK(ecclAllReduce(&x, &y, 1, ecclFloat32, ecclSum, comm, nullptr), comm);
    RANK_CHECK(y == static_cast<float>(n), "host allreduce after stream work");
    CUDA_OK(cudaStreamSynchronize(other));
    CUDA_OK(cudaFree(d));
    CUDA_OK(cudaFreeHost(host));
    RANK_OK(ecclCommDestroy(comm), nullptr);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

// Inside a group, device calls run together when their stream gets there:
// a ring of sends and receives on two streams, a send to self and an
// allreduce, every result against what the host path gives. A host buffer
// in a group that holds device buffers on the same communicator is refused
// at its call, and the group's device calls still run.
TEST_P(DeviceCollectives, GroupedCallsMatchTheHostPath) {
  ProcessGroup group(GetParam(), [](int rank, int n, const ecclUniqueId& id) {
    ecclComm_t comm = openOnGpu(rank, n, id);
    cudaStream_t sends, recvs;
    CUDA_OK(cudaStreamCreate(&sends));
    CUDA_OK(cudaStreamCreate(&recvs));
    const size_t count = 50000, bytes = count * sizeof(float);
    const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    auto mine = pattern(rank, count), fromPrev = pattern(prev, count);
    float *dIn, *dRing, *dSelf, *dSum;
    CUDA_OK(cudaMalloc(&dIn, bytes));
    CUDA_OK(cudaMalloc(&dRing, bytes));
    CUDA_OK(cudaMalloc(&dSelf, bytes));
    CUDA_OK(cudaMalloc(&dSum, bytes));
    CUDA_OK(cudaMemcpy(dIn, mine.data(), bytes, cudaMemcpyHostToDevice));
    std::vector<float> sum(count);
    RANK_OK(ecclAllReduce(mine.data(), sum.data(), count, ecclFloat32, ecclSum, comm, nullptr), comm);

    RANK_OK(ecclGroupStart(), nullptr);
    RANK_OK(ecclRecv(dRing, count, ecclFloat32, prev, comm, recvs), comm);
    RANK_OK(ecclSend(dIn, count, ecclFloat32, next, comm, sends), comm);
    RANK_OK(ecclSend(dIn, count, ecclFloat32, rank, comm, sends), comm);
    RANK_OK(ecclRecv(dSelf, count, ecclFloat32, rank, comm, recvs), comm);
    RANK_OK(ecclAllReduce(dIn, dSum, count, ecclFloat32, ecclSum, comm, sends), comm);
    float x = 1, y = 0;
    RANK_CHECK(ecclAllReduce(&x, &y, 1, ecclFloat32, ecclSum, comm, nullptr) == ecclInvalidUsage,
               "a host buffer in a group of device calls is refused");
    RANK_OK(ecclGroupEnd(), nullptr);

    // Both streams were joined to the group's work.
    CUDA_OK(cudaStreamSynchronize(sends));
    CUDA_OK(cudaStreamSynchronize(recvs));
    std::vector<float> got(count);
    auto same = [&](float* d, const std::vector<float>& want, const char* what) {
      CUDA_OK(cudaMemcpy(got.data(), d, bytes, cudaMemcpyDeviceToHost));
      RANK_CHECK(std::memcmp(got.data(), want.data(), bytes) == 0, what);
    };
    same(dRing, fromPrev, "grouped ring receive");
    same(dSelf, mine, "grouped send to self");
    same(dSum, sum, "grouped allreduce");
    ecclResult_t async = ecclSuccess;
    RANK_OK(ecclCommGetAsyncError(comm, &async), comm);
    RANK_CHECK(async == ecclSuccess, std::string("async error ") + ecclGetLastError(comm));
    for (float* d : {dIn, dRing, dSelf, dSum}) CUDA_OK(cudaFree(d));
    CUDA_OK(cudaStreamDestroy(sends));
    CUDA_OK(cudaStreamDestroy(recvs));
    RANK_OK(ecclCommDestroy(comm), nullptr);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

// The MoE dispatch and combine on device buffers give bit for bit what
// they give on host buffers: the rows each expert receives (and their
// layout), and the combined output. The placement table is read from the
// device in one run and from the host in the other.
TEST_P(DeviceCollectives, MoeDispatchAndCombineMatchTheHostPath) {
  ProcessGroup group(GetParam(), [](int rank, int n, const ecclUniqueId& id) {
    ecclComm_t comm = openOnGpu(rank, n, id);
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreate(&stream));
    MoeCase c = moeCase(rank, n);
    MoeOnHost host = moeOnHost(c, comm);

    float *dX, *dWeights, *dOut;
    int32_t *dRoute, *dReplicas;
    CUDA_OK(cudaMalloc(&dX, c.x.size() * sizeof(float)));
    CUDA_OK(cudaMalloc(&dWeights, c.weights.size() * sizeof(float)));
    CUDA_OK(cudaMalloc(&dOut, host.out.size() * sizeof(float)));
    CUDA_OK(cudaMalloc(&dRoute, c.route.size() * sizeof(int32_t)));
    CUDA_OK(cudaMalloc(&dReplicas, c.replicas.size() * sizeof(int32_t)));
    CUDA_OK(cudaMemcpyAsync(dX, c.x.data(), c.x.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
    CUDA_OK(cudaMemcpyAsync(dRoute, c.route.data(), c.route.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
    CUDA_OK(cudaMemcpyAsync(dWeights, c.weights.data(), c.weights.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
    CUDA_OK(cudaMemcpyAsync(dReplicas, c.replicas.data(), c.replicas.size() * sizeof(int32_t), cudaMemcpyHostToDevice,
                            stream));
    for (bool tableOnDevice : {true, false}) {
      ecclMoePlan_t plan;
      RANK_OK(ecclMoeDispatch(dX, dRoute, c.tokens, c.topk, c.hidden, ecclFloat32,
                              tableOnDevice ? dReplicas : c.replicas.data(), c.experts, &plan, comm, stream), comm);
      void* dRows = expertRowsLikeTheHost(plan, host, comm);
      std::vector<float> got(host.rowCount * c.hidden);
      CUDA_OK(cudaMemcpyAsync(got.data(), dRows, got.size() * sizeof(float), cudaMemcpyDeviceToHost, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      RANK_CHECK(std::memcmp(got.data(), host.rows, got.size() * sizeof(float)) == 0,
                 "the rows received on the device differ from the host dispatch's");
      // The host plan's rows hold the host dispatch's input to the combine, which these rows equal.
      RANK_OK(ecclMoeCombine(plan, dRows, dWeights, dOut, comm, stream), comm);
      std::vector<float> out(host.out.size());
      CUDA_OK(cudaMemcpyAsync(out.data(), dOut, out.size() * sizeof(float), cudaMemcpyDeviceToHost, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      RANK_CHECK(std::memcmp(out.data(), host.out.data(), out.size() * sizeof(float)) == 0,
                 "the device combine differs from the host combine");
      RANK_CHECK(ecclMoeCombine(plan, host.rows, c.weights.data(), out.data(), comm, nullptr) == ecclInvalidArgument,
                 "a device plan refuses a combine on host buffers");
      RANK_OK(ecclMoePlanDestroy(plan), comm);
    }
    ecclResult_t async = ecclSuccess;
    RANK_OK(ecclCommGetAsyncError(comm, &async), comm);
    RANK_CHECK(async == ecclSuccess, std::string("async error ") + ecclGetLastError(comm));
    RANK_OK(ecclMoePlanDestroy(host.plan), comm);
    CUDA_OK(cudaStreamSynchronize(stream));
    for (void* d : {static_cast<void*>(dX), static_cast<void*>(dWeights), static_cast<void*>(dOut),
                    static_cast<void*>(dRoute), static_cast<void*>(dReplicas)})
      CUDA_OK(cudaFree(d));
    CUDA_OK(cudaStreamDestroy(stream));
    RANK_OK(ecclCommDestroy(comm), nullptr);
  });
  auto outcomes = group.wait(std::chrono::seconds(60));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

INSTANTIATE_TEST_SUITE_P(Ranks, DeviceCollectives, ::testing::Values(2, 3, 4));

// Peer-memory snapshots of GPU memory (docs/snapshots.md): each rank puts
// a state that lives on the GPU (odd size, several names), the version
// commits everywhere, and what ecclSnapshotGet writes back into a second
// GPU buffer equals the state byte for byte.
using DeviceSnapshots = OnGpu;

TEST_F(DeviceSnapshots, AStateOnTheGpuIsPutCommittedAndGotBackByteForByte) {
  ProcessGroup group(2, [](int rank, int n, const ecclUniqueId& id) {
    ecclComm_t comm = openOnGpu(rank, n, id);
    ecclSnapshotConfig_t cfg{};
    cfg.size = sizeof(cfg);
    cfg.replicas = 1;
    cfg.replicasSet = 1;
    RANK_OK(ecclSnapshotConfigure(comm, &cfg), comm);
    const size_t bytes = (3 << 20) + 123;
    std::vector<uint8_t> state(bytes), got(bytes);
    for (size_t i = 0; i < bytes; ++i) state[i] = static_cast<uint8_t>(i * 29 + 7 * rank);
    uint8_t *dState, *dBack;
    CUDA_OK(cudaMalloc(&dState, bytes));
    CUDA_OK(cudaMalloc(&dBack, bytes));
    CUDA_OK(cudaMemcpy(dState, state.data(), bytes, cudaMemcpyHostToDevice));
    const char* names[] = {"layer0", "layer1", "optimizer"};
    const size_t part = bytes / 3;
    for (int k = 0; k < 3; ++k)
      RANK_OK(ecclSnapshotPut(comm, 1, names[k], dState + part * k, k == 2 ? bytes - 2 * part : part), comm);
    RANK_OK(ecclSnapshotCommit(comm, 1), comm);
    RANK_OK(ecclSnapshotWait(comm, 1, 30000), comm);
    CUDA_OK(cudaMemset(dState, 0, bytes));
    for (int k = 0; k < 3; ++k) {
      int64_t version = -1;
      RANK_OK(ecclSnapshotGet(comm, names[k], dBack + part * k, k == 2 ? bytes - 2 * part : part, &version), comm);
      RANK_CHECK(version == 1, std::string(names[k]) + " came from version " + std::to_string(version));
    }
    CUDA_OK(cudaMemcpy(got.data(), dBack, bytes, cudaMemcpyDeviceToHost));
    RANK_CHECK(got == state, "the state got back from the snapshot differs from what was put");
    CUDA_OK(cudaFree(dState));
    CUDA_OK(cudaFree(dBack));
    RANK_OK(ecclCommDestroy(comm), comm);
  });
  auto outcomes = group.wait(std::chrono::seconds(120));
  EXPECT_TRUE(allSucceeded(outcomes)) << describe(outcomes);
}

}  // namespace
}  // namespace eccl::test
