// Real NCCL under the preload shim, with a GPU: two ranks (eccl-run, with
// LD_PRELOAD=libeccl-preload.so; nccl_failover.sh starts them) make an NCCL
// communicator, check an allreduce, and rank 1 is SIGKILLed (eccl-run
// --kill-when) while rank 0 has an allreduce pending. Rank 0 polls
// ncclCommGetAsyncError as PyTorch's watchdog does: it must report an
// error within 2 s, and ncclCommAbort must then return.
// argv[1]: a file through which rank 0 hands NCCL's unique id to rank 1.
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "nccl_failover: %s\n", what.c_str());
  std::exit(1);
}
void cudaCheck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
}
void ncclCheck(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) die(std::string(what) + ": " + ncclGetErrorString(r));
}

ncclUniqueId shareId(int rank, const std::string& path) {
  ncclUniqueId id;
  if (rank == 0) {
    ncclCheck(ncclGetUniqueId(&id), "ncclGetUniqueId");
    std::string tmp = path + ".tmp";
    std::ofstream(tmp, std::ios::binary).write(id.internal, sizeof(id.internal));
    if (std::rename(tmp.c_str(), path.c_str()) != 0) die("cannot publish the unique id at " + path);
    return id;
  }
  for (auto stop = Clock::now() + std::chrono::seconds(60); Clock::now() < stop;) {
    std::ifstream in(path, std::ios::binary);
    if (in && in.read(id.internal, sizeof(id.internal))) return id;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  die("rank 0 never published NCCL's unique id at " + path);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) die("usage: nccl_failover ID_FILE (under eccl-run -np 2 with the shim preloaded)");
  const char* rankText = std::getenv("ECCL_RANK");
  if (!rankText) die("ECCL_RANK is unset: run under eccl-run");
  const int rank = std::atoi(rankText), n = 2;
  setenv("NCCL_HOSTID", ("eccl-failover-rank" + std::to_string(rank)).c_str(), 1);
  int devices = 0;
  cudaCheck(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  cudaCheck(cudaSetDevice(rank % devices), "cudaSetDevice");
  cudaStream_t stream;
  cudaCheck(cudaStreamCreate(&stream), "cudaStreamCreate");

  ncclUniqueId id = shareId(rank, argv[1]);
  ncclComm_t comm;
  ncclCheck(ncclCommInitRank(&comm, n, id, rank), "ncclCommInitRank");
  const char* plugin = std::getenv("NCCL_NET_PLUGIN");
  if (!plugin || std::string(plugin) != "eccl") die("the shim did not select eccl's net plugin");

  const size_t count = 1 << 20;
  float* d = nullptr;
  cudaCheck(cudaMalloc(&d, count * sizeof(float)), "cudaMalloc");
  std::vector<float> host(count, static_cast<float>(rank + 1));
  cudaCheck(cudaMemcpy(d, host.data(), count * sizeof(float), cudaMemcpyHostToDevice), "init");
  ncclCheck(ncclAllReduce(d, d, count, ncclFloat32, ncclSum, comm, stream), "ncclAllReduce");
  cudaCheck(cudaMemcpy(host.data(), d, count * sizeof(float), cudaMemcpyDeviceToHost), "read back");
  for (float v : host)
    if (v != 3.0f) die("the checked allreduce is wrong");

  if (rank == 1) {
    std::printf("rank 1: ready to die\n");
    std::fflush(stdout);
    for (;;) pause();  // eccl-run --kill-when 1:'ready to die'
  }
  // Rank 0: an allreduce that rank 1 will never join, and a watchdog.
  std::printf("rank 0: allreduce pending, polling ncclCommGetAsyncError\n");
  std::fflush(stdout);
  ncclCheck(ncclAllReduce(d, d, count, ncclFloat32, ncclSum, comm, stream), "ncclAllReduce");
  const auto start = Clock::now();
  ncclResult_t async = ncclSuccess;
  while (async == ncclSuccess || async == ncclInProgress) {
    ncclCheck(ncclCommGetAsyncError(comm, &async), "ncclCommGetAsyncError");
    if (Clock::now() - start > std::chrono::seconds(30)) die("no error within 30 s of rank 1's death");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  std::printf("rank 0: ncclCommGetAsyncError reported %s (%d) %.0f ms after the allreduce was enqueued\n",
              ncclGetErrorString(async), static_cast<int>(async), ms);
  std::fflush(stdout);
  ncclCheck(ncclCommAbort(comm), "ncclCommAbort");
  std::printf("rank 0: ncclCommAbort returned\n");
  if (ms > 2000) die("detection took longer than 2 s");
  return 0;
}
