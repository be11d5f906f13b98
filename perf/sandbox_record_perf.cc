// sandbox_record_perf: what a rank's sandbox recording costs the job, in
// one run (eccl-run -np N --standby 1 sandbox_record_perf, with
// ECCL_PREPARE=eager so the standby is kept connected). Rank 1 records
// --calls allreduces of --allreduce-bytes each (a step's gradients) and
// ships them to the standby, which runs the same step in its sandbox:
//   ship       from the last recorded call until the rank's sends of it
//              completed: every byte left for the standby (ms, GB/s)
//   allreduce  busbw of the ranks' allreduces alone, and from the arming
//              of a recording until it reached the standby (the recorded
//              calls' copies included); rounds alternate. The ratio is
//              what the recording costs the training step's collectives.
// Medians of --rounds rounds, nccl-tests columns.
#include "cli/cli.h"
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eccl.h"
#include "perf/common/rounds.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kRecorder = 1;

void check(ecclResult_t r, ecclComm_t comm, const char* what) {
  eccl::perf::checkOrExit("sandbox_record_perf", r, comm, what);
}
using eccl::perf::median;
using eccl::perf::secondsSince;


uint64_t shipped(ecclComm_t comm) {
  ecclCommStats_t s{};
  s.size = sizeof(s);
  check(ecclCommGetStats(comm, &s), comm, "stats");
  return s.sandboxRecordingsShipped;
}

// The standby: runs the ranks' step in its sandbox until eccl-run ends it.
int standby(int nranks, int calls, size_t bytes) {
  const char* text = getenv("ECCL_UNIQUE_ID");
  ecclUniqueId id;
  if (!text || ecclUniqueIdFromString(text, &id) != ecclSuccess) {
    fprintf(stderr, "sandbox_record_perf: a standby needs ECCL_UNIQUE_ID (run it under eccl-run --standby 1)\n");
    return 2;
  }
  ecclComm_t comm;
  check(ecclCommRegisterStandby(&comm, id, nullptr), nullptr, "register");
  check(ecclCommSandbox(comm, nranks, kRecorder), comm, "sandbox");
  std::vector<float> grad(bytes / sizeof(float), 1.0f);
  while (ecclCommAwaitPromotion(comm, 20) == ecclTimeout)
    for (int c = 0; c < calls; ++c)
      check(ecclAllReduce(grad.data(), grad.data(), grad.size(), ecclFloat32, ecclSum, comm, nullptr), comm, "step");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  eccl::cli::App app{"sandbox_record_perf: a sandbox recording's shipping time and its cost to concurrent allreduces"};
  std::vector<size_t> sizes{1 << 20, 4 << 20, 16 << 20};
  int calls = 8, rounds = 5, nranks = 3;
  bool json = false;
  app.option("--allreduce-bytes", sizes, "bytes per allreduce (the recording holds --calls of them)")
        .delimiter(',');
  app.option("--calls", calls, "allreduces per recorded step").range(1, 4096);
  app.option("--rounds", rounds, "alternating rounds per size").range(1, 1000);
  app.option("--ranks", nranks, "the job's ranks (what the standby's sandbox pretends)").range(2, 4096);
  app.flag("--json", json, "one JSON object per size");
  if (int status = app.parse(argc, argv); status >= 0) return status;
  const size_t maxBytes = *std::max_element(sizes.begin(), sizes.end());
  if (const char* role = getenv("ECCL_ROLE"); role && std::string(role) == "standby")
    return standby(nranks, calls, maxBytes);

  ecclComm_t comm;
  check(ecclCommInitFromEnv(&comm), nullptr, "ecclCommInitFromEnv");
  int rank, n;
  ecclCommUserRank(comm, &rank);
  ecclCommCount(comm, &n);
  if (n != nranks || n < 2) {
    fprintf(stderr, "sandbox_record_perf: run it on --ranks (%d) ranks and one standby\n", nranks);
    return 2;
  }
  std::vector<float> grad(maxBytes / sizeof(float), 1.0f);

  // Busbw over the ops of one round; with a recording, ops run until the
  // standby has it. Every rank votes after each op so all run the same ops.
  auto round = [&](bool record, size_t bytes, double* shipSeconds) {
    const size_t count = bytes / sizeof(float);
    check(ecclBarrier(comm), comm, "barrier");
    const uint64_t before = rank == kRecorder ? shipped(comm) : 0;
    if (record && rank == kRecorder) check(ecclCommSandboxRecord(comm, calls), comm, "record");
    auto t = Clock::now();
    auto allreduce = [&] {
      check(ecclAllReduce(grad.data(), grad.data(), count, ecclFloat32, ecclSum, comm, nullptr), comm, "allreduce");
    };
    // The recorded step: nothing between its calls, so the recording is them.
    for (int c = 0; c < calls; ++c) allreduce();
    const Clock::time_point recorded = Clock::now();
    int ops = calls;
    for (;;) {
      allreduce();
      ++ops;
      int64_t go = ops < 2 * calls ? 1 : 0;
      if (record && rank == kRecorder) {
        const bool done = shipped(comm) > before;
        if (done && *shipSeconds < 0) *shipSeconds = secondsSince(recorded);
        go = done ? go : 1;
      }
      check(ecclAllReduce(&go, &go, 1, ecclInt64, ecclMax, comm, nullptr), comm, "vote");
      if (!go) break;
      if (ops > 100000) {
        fprintf(stderr, "sandbox_record_perf: the recording never reached the standby (is ECCL_PREPARE=eager set?)\n");
        exit(1);
      }
    }
    double s = secondsSince(t) / ops;
    check(ecclAllReduce(&s, &s, 1, ecclFloat64, ecclMax, comm, nullptr), comm, "report");
    return 2.0 * double(n - 1) / n * double(bytes) / s / 1e9;
  };

  if (rank == 0 && !json)
    printf("# sandbox_record_perf: %d ranks + 1 eager standby, %d recorded allreduces per step, median of %d rounds\n"
           "# %12s %12s %9s %9s | %9s %9s %7s\n"
           "# %12s %12s %9s %9s | %9s %9s %7s\n",
           n, calls, rounds, "size", "recording", "ship", "algbw", "busbw", "busbw", "with/", "(B/call)", "(B)", "(ms)",
           "(GB/s)", "alone", "w/ ship", "alone");
  for (size_t bytes : sizes) {
    double warm = -1;
    round(true, bytes, &warm);  // lanes and copies touched once
    std::vector<double> alone, with, ship;
    for (int r = 0; r < rounds; ++r) {
      double unused = -1, s = -1;
      alone.push_back(round(false, bytes, &unused));
      with.push_back(round(true, bytes, &s));
      check(ecclAllReduce(&s, &s, 1, ecclFloat64, ecclMax, comm, nullptr), comm, "ship time");
      ship.push_back(s);
    }
    if (rank != 0) continue;
    const double recording = double(bytes) * calls, shipMs = median(ship) * 1e3;
    const double ratio = median(with) / median(alone);
    if (json)
      printf("%s\n", nlohmann::json{{"size", bytes}, {"recording_bytes", recording}, {"ship_ms", shipMs},
                                    {"ship_gbs", recording / 1e9 / (shipMs / 1e3)},
                                    {"allreduce_busbw_alone", median(alone)}, {"allreduce_busbw_with", median(with)},
                                    {"allreduce_ratio", ratio}}
                         .dump()
                         .c_str());
    else
      printf("  %12zu %12.0f %9.1f %9.3f | %9.3f %9.3f %7.3f\n", bytes, recording, shipMs,
             recording / 1e9 / (shipMs / 1e3), median(alone), median(with), ratio);
    fflush(stdout);
  }
  check(ecclCommDestroy(comm), nullptr, "destroy");
  return 0;
}
