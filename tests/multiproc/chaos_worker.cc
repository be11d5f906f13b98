// The chaos worker: runs under `eccl-run --chaos MS --refill` (random
// SIGKILLs, a standby pool kept full) and checks every allreduce element by
// element. On any failure it recovers with REPLACE (waiting for the
// launcher's next standby if the pool is momentarily empty) and goes on.
// Once the chaos is over (no view change for --quiet-ms), at least
// --min-epoch views went by and --min-seconds passed (chaos that changes no
// view, such as killing coordinators, needs the time), every rank stops at
// the same step. Any wrong
// element, unexpected error code or missed deadline exits non-zero.
#include "cli/cli.h"

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "eccl.h"

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const std::string& what, ecclComm_t comm) {
  fprintf(stderr, "chaos_worker: %s: %s\n", what.c_str(), ecclGetLastError(comm));
  exit(1);
}

[[noreturn]] void dieOfCheck(const std::string& what) {
  fprintf(stderr, "chaos_worker: %s\n", what.c_str());
  exit(1);
}

ecclCommStats_t statsOf(ecclComm_t comm) {
  ecclCommStats_t s{};
  s.size = sizeof(s);
  if (ecclCommGetStats(comm, &s) != ecclSuccess) die("ecclCommGetStats", comm);
  return s;
}

// A failure here is expected (the chaos); anything but a peer failure or
// a timeout caused by one is a bug.
bool expectedFailure(ecclResult_t r) { return r == ecclRemoteError || r == ecclTimeout; }

void recover(ecclComm_t comm) {
  auto deadline = Clock::now() + std::chrono::seconds(60);
  for (;;) {
    ecclResult_t r = ecclCommRecover(comm, ecclRecoverReplace);
    if (r == ecclSuccess) return;
    std::string why = ecclGetLastError(comm);
    if (r == ecclEvicted) die("evicted while recovering", comm);
    if (Clock::now() > deadline) die("no recovery within 60 s", comm);
    // The launcher refills the standby pool; a refused REPLACE is retried.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

int main(int argc, char** argv) {
  eccl::cli::App app{"chaos_worker: checked allreduces through random kills"};
  int minEpoch = 2, quietMs = 2000;
  double minSeconds = 0;
  size_t count = 4096;
  app.option("--min-epoch", minEpoch, "do not stop before this epoch").range(1, 1000000);
  app.option("--min-seconds", minSeconds, "do not stop before this many seconds").range(0.0, 86400.0);
  app.option("--quiet-ms", quietMs, "stop once the view has not changed for this long").range(1, 3600000);
  app.option("--count", count, "int64 elements per allreduce").range(1, 1 << 24);
  if (int status = app.parse(argc, argv); status >= 0) return status;

  ecclComm_t comm;
  if (ecclResult_t r = ecclCommInitFromEnv(&comm); r != ecclSuccess)
    die(std::string("ecclCommInitFromEnv (") + ecclGetErrorString(r) + ")", nullptr);
  std::vector<int64_t> v(count);
  uint64_t checked = 0, failures = 0;
  int64_t iteration = 0;  // within the current epoch; every member of a view starts at 0
  uint32_t epoch = statsOf(comm).epoch;
  auto epochStart = Clock::now();
  const auto started = Clock::now();
  for (;;) {
    ecclCommStats_t s = statsOf(comm);
    if (s.epoch != epoch) epoch = s.epoch, iteration = 0, epochStart = Clock::now();
    int n = s.nranks, rank = s.rank;
    for (size_t i = 0; i < count; ++i) v[i] = (rank + 1) * 1000003 + static_cast<int64_t>(i) * 7 + iteration;
    ecclResult_t r = ecclAllReduce(v.data(), v.data(), count, ecclInt64, ecclSum, comm, nullptr);
    int32_t done = 0;
    if (r == ecclSuccess) {
      for (size_t i = 0; i < count; ++i) {
        int64_t want = int64_t(n) * (n + 1) / 2 * 1000003 + n * (static_cast<int64_t>(i) * 7 + iteration);
        if (v[i] != want)
          dieOfCheck("epoch " + std::to_string(epoch) + " iteration " + std::to_string(iteration) + " element " +
                  std::to_string(i) + ": got " + std::to_string(v[i]) + ", want " + std::to_string(want));
      }
      ++checked;
      ++iteration;
      // Stop together: the decision is itself a collective.
      done = static_cast<int64_t>(epoch) >= minEpoch && Clock::now() - epochStart > std::chrono::milliseconds(quietMs) &&
             Clock::now() - started > std::chrono::duration<double>(minSeconds);
      r = ecclAllReduce(&done, &done, 1, ecclInt32, ecclMax, comm, nullptr);
      if (r == ecclSuccess && done) break;
    }
    if (r != ecclSuccess) {
      if (!expectedFailure(r)) die(std::string("unexpected ") + ecclGetErrorString(r), comm);
      ++failures;
      recover(comm);
    }
  }
  ecclCommStats_t s = statsOf(comm);
  if (s.rank == 0)
    printf("chaos_worker: %" PRIu64 " allreduces checked element by element, %" PRIu64
           " failures seen by rank 0's process, finished at epoch %u with %d ranks\n",
           checked, failures, s.epoch, s.nranks);
  ecclCommDestroy(comm);
  return 0;
}
