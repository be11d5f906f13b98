// Allreduce on device buffers: eccl's stream path against NCCL on the same
// GPUs and ranks, and against eccl's own host path (what the staging costs),
// in one run. nccl-tests columns (time and busbw per size) for each; run
// under eccl-run (`eccl-run -np 2 device_perf`). NCCL needs one GPU per
// rank: with fewer GPUs than ranks its column says so instead.
#include <cuda_runtime.h>
#include <nccl.h>

#include "cli/cli.h"
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "eccl.h"

namespace {

void cudaCheck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "device_perf: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
void ecclCheck(ecclResult_t r, ecclComm_t comm, const char* what) {
  if (r != ecclSuccess) {
    std::fprintf(stderr, "device_perf: %s: %s (%s)\n", what, ecclGetErrorString(r), ecclGetLastError(comm));
    std::exit(1);
  }
}
void ncclCheck(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) {
    std::fprintf(stderr, "device_perf: %s: %s\n", what, ncclGetErrorString(r));
    std::exit(1);
  }
}

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Times `iters` ops enqueued back to back on the stream (after `warmup`),
// as nccl-tests does; the slowest rank's time counts.
template <typename F>
double timeOps(F op, cudaStream_t stream, int warmup, int iters, ecclComm_t comm) {
  for (int i = 0; i < warmup; ++i) op();
  cudaCheck(cudaStreamSynchronize(stream), "warm-up");
  double t0 = seconds();
  for (int i = 0; i < iters; ++i) op();
  cudaCheck(cudaStreamSynchronize(stream), "timed ops");
  double us = (seconds() - t0) / iters * 1e6;
  double slowest = 0;
  ecclCheck(ecclAllReduce(&us, &slowest, 1, ecclFloat64, ecclMax, comm, nullptr), comm, "max over ranks");
  return slowest;
}

}  // namespace

int main(int argc, char** argv) {
  eccl::cli::App app{"device-buffer allreduce: eccl (stream path, host path) against NCCL"};
  std::string minText = "8", maxText = "256M";
  int factor = 4, iters = 20, warmup = 5;
  app.option("-b", minText, "smallest size in bytes (K, M, G suffixes)");
  app.option("-e", maxText, "largest size");
  app.option("-f", factor, "size factor").range(2, 1024);
  app.option("-n", iters, "timed iterations").range(1, 1000000);
  app.option("-w", warmup, "warm-up iterations").range(0, 100000);
  if (int status = app.parse(argc, argv); status >= 0) return status;
  auto parseSize = [](const std::string& s) {
    size_t v = std::stoull(s);
    char u = s.empty() ? 0 : s.back();
    return u == 'K' ? v << 10 : u == 'M' ? v << 20 : u == 'G' ? v << 30 : v;
  };
  const size_t minBytes = parseSize(minText), maxBytes = parseSize(maxText);

  ecclComm_t comm;
  ecclCheck(ecclCommInitFromEnv(&comm), nullptr, "ecclCommInitFromEnv (run under eccl-run)");
  int rank = 0, n = 0, devices = 0;
  ecclCommUserRank(comm, &rank);
  ecclCommCount(comm, &n);
  cudaCheck(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  cudaCheck(cudaSetDevice(rank % devices), "cudaSetDevice");
  cudaStream_t stream;
  cudaCheck(cudaStreamCreate(&stream), "cudaStreamCreate");

  // NCCL refuses two ranks on one GPU.
  ncclComm_t nccl = nullptr;
  if (devices >= n) {
    ncclUniqueId id;
    if (rank == 0) ncclCheck(ncclGetUniqueId(&id), "ncclGetUniqueId");
    ecclCheck(ecclBroadcast(&id, &id, sizeof(id), ecclUint8, 0, comm, nullptr), comm, "sharing NCCL's id");
    ncclCheck(ncclCommInitRank(&nccl, n, id, rank), "ncclCommInitRank");
  }

  const size_t maxCount = maxBytes / sizeof(float);
  float* d = nullptr;
  cudaCheck(cudaMalloc(&d, std::max<size_t>(maxBytes, 4)), "cudaMalloc");
  std::vector<float> host(std::max<size_t>(maxCount, 1));
  if (rank == 0) {
    std::printf("# device_perf: %d ranks on %d GPU(s); allreduce float sum in place; busbw in GB/s\n", n, devices);
    std::printf("# %s\n", nccl ? "NCCL on the same GPUs and ranks" : "NCCL: not run (it needs one GPU per rank)");
    std::printf("%12s %12s %9s %9s %12s %9s %9s %12s %9s %9s\n", "size", "eccl-dev us", "busbw", "check", "eccl-host us",
                "busbw", "x host", "nccl us", "busbw", "x nccl");
  }
  for (size_t bytes = minBytes; bytes <= maxBytes; bytes *= factor) {
    const size_t count = bytes / sizeof(float);
    // Rank r contributes r+1 everywhere: the exact sum is n(n+1)/2.
    std::vector<float> init(count);
    for (size_t i = 0; i < count; ++i) init[i] = static_cast<float>(rank + 1);
    cudaCheck(cudaMemcpy(d, init.data(), count * sizeof(float), cudaMemcpyHostToDevice), "init");
    ecclCheck(ecclAllReduce(d, d, count, ecclFloat32, ecclSum, comm, stream), comm, "checked allreduce");
    cudaCheck(cudaMemcpyAsync(host.data(), d, count * sizeof(float), cudaMemcpyDeviceToHost, stream), "read back");
    cudaCheck(cudaStreamSynchronize(stream), "checked allreduce");
    size_t wrong = 0;
    for (size_t i = 0; i < count; ++i) wrong += host[i] != static_cast<float>(n * (n + 1) / 2);
    const double factorBus = 2.0 * (n - 1) / n;
    auto bw = [&](double us) { return us > 0 ? bytes / us / 1e3 * factorBus : 0.0; };
    double dev = timeOps([&] { ecclAllReduce(d, d, count, ecclFloat32, ecclSum, comm, stream); }, stream, warmup,
                         iters, comm);
    double hostUs = timeOps([&] { ecclAllReduce(host.data(), host.data(), count, ecclFloat32, ecclSum, comm, nullptr); },
                            stream, warmup, iters, comm);
    double ncclUs = 0;
    if (nccl)
      ncclUs = timeOps([&] { ncclAllReduce(d, d, count, ncclFloat32, ncclSum, nccl, stream); }, stream, warmup, iters,
                       comm);
    ecclResult_t async = ecclSuccess;
    ecclCommGetAsyncError(comm, &async);
    if (async != ecclSuccess) ecclCheck(async, comm, "stream-ordered allreduce");
    if (rank == 0) {
      std::printf("%12zu %12.2f %9.3f %9s %12.2f %9.3f %9.2f", bytes, dev, bw(dev), wrong ? "WRONG" : "ok", hostUs,
                  bw(hostUs), hostUs / dev);
      if (nccl)
        std::printf(" %12.2f %9.3f %9.2f\n", ncclUs, bw(ncclUs), ncclUs / dev);
      else
        std::printf(" %12s %9s %9s\n", "n/a", "n/a", "n/a");
    }
    if (wrong) return 1;
    if (bytes > maxBytes / factor) break;
  }
  cudaCheck(cudaFree(d), "cudaFree");
  if (nccl) ncclCommDestroy(nccl);
  ecclCheck(ecclCommDestroy(comm), nullptr, "ecclCommDestroy");
  return 0;
}
