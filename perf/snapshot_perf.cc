// snapshot_perf: what peer-memory snapshots cost and give, in one run
// (eccl-run -np N snapshot_perf), per size of a rank's snapshot:
//   snapshot   put + commit + wait of `size` bytes per rank (8 names),
//              replicated to --replicas other ranks: per-rank GB/s
//   allreduce  busbw of an --allreduce-bytes allreduce alone, and while a
//              snapshot of `size` replicates (rounds alternate); the ratio
//              is the snapshot's cost to the training step's collectives
//   restore    rank 0 forgets its copies and restores them from its
//              holder's memory (the restore protocol a replacement runs),
//              against reading the same bytes from a local file (written
//              and fsynced here, dropped from the page cache first)
// Medians of --rounds rounds; the columns follow nccl-tests (size, time,
// bandwidth) with the ratios the targets read.
#include "cli/cli.h"
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "api/guard.h"
#include "eccl.h"
#include "perf/common/rounds.h"
#include "snapshot/snapshots.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kNames = 8;

void check(ecclResult_t r, ecclComm_t comm, const char* what) { eccl::perf::checkOrExit("snapshot_perf", r, comm, what); }
using eccl::perf::median;
using eccl::perf::secondsSince;


// The slowest rank's time.
double slowest(ecclComm_t comm, double s) {
  check(ecclAllReduce(&s, &s, 1, ecclFloat64, ecclMax, comm, nullptr), comm, "report");
  return s;
}

// Reads `bytes` from a file written and fsynced beforehand, with its pages
// dropped from the cache: what a restart from local disk pays.
double fileRead(const std::string& path, std::vector<uint8_t>& buf) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return -1;
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  auto t = Clock::now();
  size_t done = 0;
  while (done < buf.size()) {
    ssize_t n = ::read(fd, buf.data() + done, buf.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  double s = secondsSince(t);
  ::close(fd);
  return done == buf.size() ? s : -1;
}

}  // namespace

int main(int argc, char** argv) {
  eccl::cli::App app{"snapshot_perf: snapshot throughput, its cost to a concurrent allreduce, restore vs a local file"};
  std::vector<size_t> sizes{64 << 20, 256 << 20, 1024ull << 20};
  size_t allreduceBytes = 4 << 20;
  int rounds = 3, replicas = 1;
  std::string fileDir = "/tmp";
  bool json = false;
  app.option("--sizes", sizes, "snapshot bytes per rank").delimiter(',');
  app.option("--allreduce-bytes", allreduceBytes, "the concurrent allreduce's size");
  app.option("--rounds", rounds, "alternating rounds per size").range(1, 1000);
  app.option("--replicas", replicas, "ECCL snapshot replicas").range(1, 64);
  app.option("--file-dir", fileDir, "where the local-file comparison writes");
  app.flag("--json", json, "one JSON object per size");
  if (int status = app.parse(argc, argv); status >= 0) return status;

  ecclComm_t comm;
  check(ecclCommInitFromEnv(&comm), nullptr, "ecclCommInitFromEnv");
  int rank, n;
  ecclCommUserRank(comm, &rank);
  ecclCommCount(comm, &n);
  if (n < 2) {
    fprintf(stderr, "snapshot_perf: run it on 2 or more ranks (eccl-run -np 2 snapshot_perf)\n");
    return 2;
  }
  ecclSnapshotConfig_t cfg{};
  cfg.size = sizeof(cfg);
  cfg.replicas = std::min(replicas, n - 1);
  cfg.replicasSet = 1;
  check(ecclSnapshotConfigure(comm, &cfg), comm, "configure");
  const size_t maxBytes = *std::max_element(sizes.begin(), sizes.end());
  std::vector<uint8_t> state(maxBytes);
  for (size_t i = 0; i < state.size(); ++i) state[i] = static_cast<uint8_t>(i * 131 + size_t(rank));
  std::vector<float> grad(allreduceBytes / sizeof(float), 1.0f);
  int64_t version = 0;

  auto putAll = [&](size_t bytes) {
    ++version;
    const size_t part = bytes / kNames;
    for (int k = 0; k < kNames; ++k) {
      size_t len = k == kNames - 1 ? bytes - part * (kNames - 1) : part;
      check(ecclSnapshotPut(comm, version, ("block" + std::to_string(k)).c_str(), state.data() + part * k, len), comm,
            "put");
    }
    check(ecclSnapshotCommit(comm, version), comm, "commit");
  };
  // Allreduce busbw over `ops` ops; with a snapshot, ops run until it commits.
  auto allreduce = [&](bool withSnapshot, size_t bytes) {
    check(ecclBarrier(comm), comm, "barrier");
    if (withSnapshot) putAll(bytes);
    auto t = Clock::now();
    int ops = 0;
    int64_t committed = -1;
    do {
      check(ecclAllReduce(grad.data(), grad.data(), grad.size(), ecclFloat32, ecclSum, comm, nullptr), comm,
            "allreduce");
      ++ops;
      if (withSnapshot) check(ecclSnapshotCommitted(comm, &committed), comm, "committed");
      int64_t go = withSnapshot ? (committed >= version ? 0 : 1) : (ops < 20 ? 1 : 0);
      check(ecclAllReduce(&go, &go, 1, ecclInt64, ecclMax, comm, nullptr), comm, "vote");
      if (!go) break;
    } while (true);
    double s = slowest(comm, secondsSince(t)) / ops;
    if (withSnapshot) check(ecclSnapshotWait(comm, version, 0), comm, "wait");
    return 2.0 * double(n - 1) / n * double(allreduceBytes) / s / 1e9;
  };

  if (rank == 0 && !json)
    printf("# snapshot_perf: %d ranks, %d replica(s), allreduce %zu B, median of %d rounds\n"
           "# %12s %10s %9s | %9s %9s %7s | %10s %9s %10s %9s %7s\n"
           "# %12s %10s %9s | %9s %9s %7s | %10s %9s %10s %9s %7s\n",
           n, cfg.replicas, allreduceBytes, rounds, "size", "snapshot", "algbw", "busbw", "busbw", "with/", "restore",
           "algbw", "file", "algbw", "restore/", "(B/rank)", "(ms)", "(GB/s)", "alone", "w/ snap", "alone", "(ms)",
           "(GB/s)", "(ms)", "(GB/s)", "file");
  for (size_t bytes : sizes) {
    putAll(bytes);  // warm: copies and lanes touched once
    check(ecclSnapshotWait(comm, version, 0), comm, "wait");
    std::vector<double> snap, alone, with, restore, file;
    const std::string path = fileDir + "/snapshot_perf." + std::to_string(getpid()) + ".bin";
    if (rank == 0) {
      int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0 || ::write(fd, state.data(), bytes) != static_cast<ssize_t>(bytes) || ::fsync(fd) != 0) {
        fprintf(stderr, "snapshot_perf: cannot write %s\n", path.c_str());
        return 1;
      }
      ::close(fd);
    }
    std::vector<uint8_t> readBack(rank == 0 ? bytes : 0);
    for (int r = 0; r < rounds; ++r) {
      check(ecclBarrier(comm), comm, "barrier");
      auto t = Clock::now();
      putAll(bytes);
      check(ecclSnapshotWait(comm, version, 0), comm, "wait");
      snap.push_back(slowest(comm, secondsSince(t)));
      alone.push_back(allreduce(false, bytes));
      with.push_back(allreduce(true, bytes));
      // Restore: rank 0's copies come back from its holder's memory.
      if (rank == 0) comm->snapshots->forgetOwnForTesting();
      check(ecclBarrier(comm), comm, "barrier");
      t = Clock::now();
      int64_t restored = -1;
      check(ecclSnapshotRestore(comm, &restored), comm, "restore");
      restore.push_back(slowest(comm, secondsSince(t)));
      double f = rank == 0 ? fileRead(path, readBack) : 0;
      file.push_back(slowest(comm, f));
    }
    if (rank == 0) ::unlink(path.c_str());
    const double gb = double(bytes) / 1e9;
    double sMs = median(snap) * 1e3, rMs = median(restore) * 1e3, fMs = median(file) * 1e3;
    double ratio = median(with) / median(alone);
    if (rank != 0) continue;
    if (json) {
      printf("%s\n", nlohmann::json{{"size", bytes}, {"snapshot_ms", sMs}, {"snapshot_gbs", gb / (sMs / 1e3)},
                                    {"allreduce_busbw_alone", median(alone)}, {"allreduce_busbw_with", median(with)},
                                    {"allreduce_ratio", ratio}, {"restore_ms", rMs}, {"file_ms", fMs},
                                    {"restore_over_file", rMs / fMs}}
                         .dump()
                         .c_str());
    } else {
      printf("  %12zu %10.1f %9.3f | %9.3f %9.3f %7.3f | %10.1f %9.3f %10.1f %9.3f %7.2f\n", bytes, sMs,
             gb / (sMs / 1e3), median(alone), median(with), ratio, rMs, gb / (rMs / 1e3), fMs, gb / (fMs / 1e3),
             rMs / fMs);
    }
    fflush(stdout);
  }
  check(ecclCommDestroy(comm), nullptr, "destroy");
  return 0;
}
