// Real NCCL on device buffers over whichever network transport the
// environment selects: eccl's net plugin (NCCL_NET_PLUGIN=eccl
// NCCL_NET=eccl) or NCCL's own sockets (NCCL_NET=Socket). scripts/hardware.sh
// runs it both ways, alternating, and compares the medians. Run under
// eccl-run (its communicator only shares NCCL's unique ids and takes the
// slowest rank's time). With --distinct-hosts each rank gets its own
// NCCL_HOSTID, so two ranks on one GPU are let in and NCCL's traffic takes
// the network path (with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1).
//
// Prints nccl-tests columns for allreduce (float sum, in place) and for a
// ring of send/recv, each result checked, then the communicator's creation
// time: the first, and re-created (destroy + init) --recreate times, where
// the plugin's pool should make the re-creation cheap.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include "cli/cli.h"
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "eccl.h"

namespace {

// Which libnccl this process runs, and its version: the machine's own,
// which need not be the one this program was compiled against.
std::string ncclIdentity() {
  int version = 0;
  ncclGetVersion(&version);
  Dl_info info{};
  const char* path = dladdr(reinterpret_cast<void*>(&ncclGetVersion), &info) && info.dli_fname ? info.dli_fname : "?";
  // NCCL_VERSION_CODE is X*10000 + Y*100 + Z since 2.9.
  return std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100) + " (" + path + "; compiled against " + std::to_string(NCCL_MAJOR) + "." +
         std::to_string(NCCL_MINOR) + "." + std::to_string(NCCL_PATCH) + ")";
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "nccl_net_perf: %s\n", what.c_str());
  std::exit(1);
}
void cudaCheck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
}
void ncclCheck(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) die(std::string(what) + ": " + ncclGetErrorString(r) + " (" + ncclGetLastError(nullptr) + ")");
}
void ecclCheck(ecclResult_t r, ecclComm_t comm, const char* what) {
  if (r != ecclSuccess) die(std::string(what) + ": " + ecclGetErrorString(r) + " (" + ecclGetLastError(comm) + ")");
}

double nowUs() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double slowest(double us, ecclComm_t comm) {
  double out = 0;
  ecclCheck(ecclAllReduce(&us, &out, 1, ecclFloat64, ecclMax, comm, nullptr), comm, "max over ranks");
  return out;
}

// A fresh NCCL communicator: rank 0 makes the id, eccl shares it; returns
// the slowest rank's creation time in ms.
double create(ncclComm_t* nccl, int rank, int n, ecclComm_t comm) {
  ncclUniqueId id;
  if (rank == 0) ncclCheck(ncclGetUniqueId(&id), "ncclGetUniqueId");
  ecclCheck(ecclBroadcast(&id, &id, sizeof(id), ecclUint8, 0, comm, nullptr), comm, "sharing NCCL's id");
  double t0 = nowUs();
  ncclCheck(ncclCommInitRank(nccl, n, id, rank), "ncclCommInitRank");
  return slowest(nowUs() - t0, comm) / 1e3;
}

template <typename F>
double timeOps(F op, cudaStream_t stream, int warmup, int iters, ecclComm_t comm) {
  for (int i = 0; i < warmup; ++i) op();
  cudaCheck(cudaStreamSynchronize(stream), "warm-up");
  double t0 = nowUs();
  for (int i = 0; i < iters; ++i) op();
  cudaCheck(cudaStreamSynchronize(stream), "timed ops");
  return slowest((nowUs() - t0) / iters, comm);
}

size_t parseSize(const std::string& s) {
  size_t v = std::stoull(s);
  char u = s.empty() ? 0 : s.back();
  return u == 'K' ? v << 10 : u == 'M' ? v << 20 : u == 'G' ? v << 30 : v;
}

}  // namespace

int main(int argc, char** argv) {
  eccl::cli::App app{"real NCCL over eccl's net plugin or NCCL's own sockets: allreduce, send/recv, creation"};
  std::string minText = "8", maxText = "128M", label = "nccl";
  int factor = 4, iters = 20, warmup = 5, recreate = 5;
  bool distinctHosts = false;
  app.option("-b", minText, "smallest size in bytes (K, M, G suffixes)");
  app.option("-e", maxText, "largest size");
  app.option("-f", factor, "size factor").range(2, 1024);
  app.option("-n", iters, "timed iterations").range(1, 1000000);
  app.option("-w", warmup, "warm-up iterations").range(0, 100000);
  app.option("--recreate", recreate, "communicator re-creations timed").range(0, 1000);
  app.option("--label", label, "names this run's transport in the output");
  app.flag("--distinct-hosts", distinctHosts, "a NCCL_HOSTID per rank (two ranks may share a GPU)");
  if (int status = app.parse(argc, argv); status >= 0) return status;
  const size_t minBytes = parseSize(minText), maxBytes = parseSize(maxText);

  ecclComm_t comm;
  ecclCheck(ecclCommInitFromEnv(&comm), nullptr, "ecclCommInitFromEnv (run under eccl-run)");
  // eccl-run's job is this program's bootstrap, not the plugin's: the
  // plugin would try to register this rank a second time.
  unsetenv("ECCL_UNIQUE_ID");
  int rank = 0, n = 0, devices = 0;
  ecclCommUserRank(comm, &rank);
  ecclCommCount(comm, &n);
  if (distinctHosts) setenv("NCCL_HOSTID", ("eccl-hw-rank" + std::to_string(rank)).c_str(), 1);
  cudaCheck(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  cudaCheck(cudaSetDevice(rank % devices), "cudaSetDevice");
  cudaStream_t stream;
  cudaCheck(cudaStreamCreate(&stream), "cudaStreamCreate");

  ncclComm_t nccl = nullptr;
  const double firstMs = create(&nccl, rank, n, comm);
  const size_t maxCount = std::max<size_t>(maxBytes / sizeof(float), 1);
  float *d = nullptr, *in = nullptr;
  cudaCheck(cudaMalloc(&d, maxCount * sizeof(float)), "cudaMalloc");
  cudaCheck(cudaMalloc(&in, maxCount * sizeof(float)), "cudaMalloc");
  std::vector<float> host(maxCount);
  if (rank == 0) {
    std::printf("# nccl_net_perf (%s): %d ranks on %d GPU(s), NCCL_NET=%s NCCL_NET_PLUGIN=%s\n", label.c_str(), n,
                devices, getenv("NCCL_NET") ? getenv("NCCL_NET") : "(unset)",
                getenv("NCCL_NET_PLUGIN") ? getenv("NCCL_NET_PLUGIN") : "(unset)");
    std::printf("# NCCL %s\n", ncclIdentity().c_str());
    std::printf("%-10s %12s %12s %10s %10s %10s %7s\n", "op", "size", "count", "time(us)", "algbw", "busbw", "#wrong");
  }
  int failures = 0;
  const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
  for (size_t bytes = std::max<size_t>(minBytes, 4); bytes <= maxBytes; bytes *= factor) {
    const size_t count = bytes / sizeof(float);
    // Allreduce: rank r contributes r+1, the sum is n(n+1)/2 everywhere.
    std::vector<float> init(count, static_cast<float>(rank + 1));
    cudaCheck(cudaMemcpy(d, init.data(), bytes, cudaMemcpyHostToDevice), "init");
    ncclCheck(ncclAllReduce(d, d, count, ncclFloat32, ncclSum, nccl, stream), "checked allreduce");
    cudaCheck(cudaMemcpyAsync(host.data(), d, bytes, cudaMemcpyDeviceToHost, stream), "read back");
    cudaCheck(cudaStreamSynchronize(stream), "checked allreduce");
    int64_t wrong = 0;
    for (size_t i = 0; i < count; ++i) wrong += host[i] != static_cast<float>(n * (n + 1) / 2);
    double us = timeOps([&] { ncclAllReduce(d, d, count, ncclFloat32, ncclSum, nccl, stream); }, stream, warmup,
                        iters, comm);
    // Send/recv ring: each rank's values come from the previous one.
    auto ring = [&] {
      ncclGroupStart();
      ncclSend(d, count, ncclFloat32, next, nccl, stream);
      ncclRecv(in, count, ncclFloat32, prev, nccl, stream);
      ncclGroupEnd();
    };
    cudaCheck(cudaMemcpy(d, init.data(), bytes, cudaMemcpyHostToDevice), "init");
    ring();
    cudaCheck(cudaMemcpyAsync(host.data(), in, bytes, cudaMemcpyDeviceToHost, stream), "read back");
    cudaCheck(cudaStreamSynchronize(stream), "checked send/recv");
    int64_t wrongRing = 0;
    for (size_t i = 0; i < count; ++i) wrongRing += host[i] != static_cast<float>(prev + 1);
    double ringUs = timeOps(ring, stream, warmup, iters, comm);
    int64_t allWrong = 0, ringWrong = 0;
    ecclCheck(ecclAllReduce(&wrong, &allWrong, 1, ecclInt64, ecclSum, comm, nullptr), comm, "wrong counts");
    ecclCheck(ecclAllReduce(&wrongRing, &ringWrong, 1, ecclInt64, ecclSum, comm, nullptr), comm, "wrong counts");
    failures += (allWrong != 0) + (ringWrong != 0);
    if (rank == 0) {
      const double bus = 2.0 * (n - 1) / n;
      std::printf("%-10s %12zu %12zu %10.2f %10.3f %10.3f %7lld\n", "allreduce", bytes, count, us, bytes / us / 1e3,
                  bytes / us / 1e3 * bus, static_cast<long long>(allWrong));
      std::printf("%-10s %12zu %12zu %10.2f %10.3f %10.3f %7lld\n", "sendrecv", bytes, count, ringUs,
                  bytes / ringUs / 1e3, bytes / ringUs / 1e3, static_cast<long long>(ringWrong));
    }
    if (bytes > maxBytes / factor) break;
  }
  ncclResult_t async = ncclSuccess;
  ncclCheck(ncclCommGetAsyncError(nccl, &async), "ncclCommGetAsyncError");
  ncclCheck(async, "an asynchronous NCCL error");
  std::vector<double> again;
  for (int i = 0; i < recreate; ++i) {
    ncclCheck(ncclCommDestroy(nccl), "ncclCommDestroy");
    again.push_back(create(&nccl, rank, n, comm));
  }
  if (rank == 0) {
    std::sort(again.begin(), again.end());
    double median = again.empty() ? 0 : again[again.size() / 2];
    std::printf("# creation (%s): first %.2f ms; re-created median %.2f ms over %d (%.1fx)\n", label.c_str(), firstMs,
                median, recreate, median > 0 ? firstMs / median : 0.0);
  }
  cudaCheck(cudaFree(d), "cudaFree");
  cudaCheck(cudaFree(in), "cudaFree");
  ncclCommDestroy(nccl);
  ecclCheck(ecclCommDestroy(comm), nullptr, "ecclCommDestroy");
  return failures ? 1 : 0;
}
