// dispatch_perf: the MoE dispatcher's costs, each against a baseline
// measured in the same run.
//   1. schedule time vs (N, E), one rank's view (target: N=1024, E=256 in
//      2 ms on one core);
//   2. permute and combine throughput vs single-core memcpy bandwidth
//      (target >= 70%);
//   3. end to end on --ranks ranks (an eccl-run job it starts): Zipf-routed
//      tokens through ecclMoeDispatch + ecclMoeCombine with replicas
//      allocated from the load and placed by max overlap, against standard
//      expert parallelism padded to the busiest expert (one replica per
//      expert, ecclAllToAll with capacity = busiest count); bytes and time;
//   4. recovery probability of MRO vs spread vs compact placements for
//      10 nodes x 6 slots, f = 2, 8 and 16 experts under Zipf loads.
// --json prints one object per measurement.
#include "cli/cli.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "eccl.h"
#include "kernels/moe_permute.h"
#include "kernels/moe_placement.h"
#include "kernels/moe_schedule.h"
#include "perf/common/launch.h"
#include "perf/dispatch_cuda.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace eccl::moe;

double msSince(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

template <typename F>
double medianMs(int reps, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto s = Clock::now();
    f();
    t.push_back(msSince(s));
  }
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  return t[reps / 2];
}

std::vector<double> zipfLoad(int experts, double s) {
  std::vector<double> w(experts);
  for (int e = 0; e < experts; ++e) w[e] = 1.0 / std::pow(e + 1, s);
  return w;
}

// Samples top-k distinct experts per token from the Zipf weights.
std::vector<int32_t> zipfRouting(int64_t tokens, int k, int experts, double s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto w = zipfLoad(experts, s);
  std::discrete_distribution<int> pick(w.begin(), w.end());
  std::vector<int32_t> out(static_cast<size_t>(tokens) * k);
  for (int64_t t = 0; t < tokens; ++t)
    for (int j = 0; j < k; ++j) {
      int e;
      do e = pick(rng);
      while (std::find(&out[t * k], &out[t * k + j], e) != &out[t * k + j]);
      out[t * k + j] = e;
    }
  return out;
}

bool json = false;

void emit(const nlohmann::json& j) {
  if (json) printf("%s\n", j.dump().c_str());
}

void scheduleSection() {
  if (!json) printf("# schedule: one rank's send/receive plan from all-gathered counts (median of 9, one core)\n#  %6s %6s %12s\n", "N", "E", "time (ms)");
  for (int n : {8, 64, 256, 1024})
    for (int e : {8, 64, 256}) {
      std::mt19937_64 rng(n * 1000 + e);
      std::vector<int64_t> tokens(static_cast<size_t>(n) * e);
      std::vector<int32_t> replicas(static_cast<size_t>(e) * n, 0);
      for (auto& t : tokens) t = static_cast<int64_t>(rng() % 64);
      for (int x = 0; x < e; ++x)
        for (int r = 0, c = 1 + int(rng() % 4); r < c; ++r) replicas[size_t(x) * n + rng() % n]++;
      ScheduleInput in{n, e, tokens.data(), replicas.data()};
      int64_t sink = 0;
      double ms = medianMs(9, [&] { sink += computeSchedule(in, n / 2).sendToRank[0]; });
      if (!json) printf("   %6d %6d %12.3f%s\n", n, e, ms, n == 1024 && e == 256 ? (ms <= 2.0 ? "   (target <= 2 ms: met)" : "   (target <= 2 ms: NOT met)") : "");
      emit({{"section", "schedule"}, {"n", n}, {"experts", e}, {"ms", ms}, {"checksum", sink}});
    }
}

void permuteSection() {
  const int n = 8, E = 64, k = 2;
  const int64_t T = 4096, hidden = 2048;
  const size_t rowBytes = hidden * sizeof(float);
  auto topk = zipfRouting(T, k, E, 1.1, 7);
  std::vector<int64_t> tokens(static_cast<size_t>(n) * E, 0);
  for (int32_t e : topk) tokens[e]++;  // rank 0's counts; other ranks route like it
  for (int j = 1; j < n; ++j) std::copy(tokens.begin(), tokens.begin() + E, tokens.begin() + size_t(j) * E);
  std::vector<int32_t> replicas(static_cast<size_t>(E) * n, 0);
  for (int e = 0; e < E; ++e) replicas[size_t(e) * n + e % n] = 1 + (e < 4);
  ScheduleInput in{n, E, tokens.data(), replicas.data()};
  RankSchedule s = computeSchedule(in, 0);
  PermutePlan plan = planPermute(topk.data(), T, k, s, E);
  std::vector<float> x(static_cast<size_t>(T) * hidden, 1.5f), sendBuf(static_cast<size_t>(plan.sendRows) * hidden);
  std::vector<float> src(sendBuf.size(), 2.0f), dst(sendBuf.size()), out(static_cast<size_t>(T) * hidden),
      weights(static_cast<size_t>(T) * k, 0.5f);
  const double bytes = double(plan.sendRows) * rowBytes;
  permuteRows(x.data(), rowBytes, T, k, plan, sendBuf.data());  // warm the pages
  std::memcpy(dst.data(), src.data(), bytes);
  double memcpyMs = medianMs(7, [&] { std::memcpy(dst.data(), src.data(), static_cast<size_t>(bytes)); });
  double permuteMs = medianMs(7, [&] { permuteRows(x.data(), rowBytes, T, k, plan, sendBuf.data()); });
  // Combine reads k rows and writes one per token: compare bytes touched.
  double combineMs = medianMs(7, [&] { combineRows(sendBuf.data(), weights.data(), T, k, hidden, ecclFloat32, plan, out.data()); });
  double memcpyGBs = 2 * bytes / memcpyMs / 1e6;  // read + write
  double permuteGBs = 2 * bytes / permuteMs / 1e6;
  double combineBytes = bytes + double(T) * rowBytes;
  double combineGBs = combineBytes / combineMs / 1e6;
  if (!json) {
    printf("# permute/combine: %" PRId64 " tokens x top-%d, hidden %" PRId64 " float32 (%.0f MB moved), one core\n", T, k, hidden,
           bytes / 1e6);
    printf("#  %-10s %10s %12s %10s\n", "kernel", "time (ms)", "GB/s (r+w)", "vs memcpy");
    printf("   %-10s %10.2f %12.2f %10s\n", "memcpy", memcpyMs, memcpyGBs, "1.00");
    printf("   %-10s %10.2f %12.2f %10.2f\n", "permute", permuteMs, permuteGBs, permuteGBs / memcpyGBs);
    printf("   %-10s %10.2f %12.2f %10.2f\n", "combine", combineMs, combineGBs, combineGBs / memcpyGBs);
  }
  emit({{"section", "permute"}, {"memcpy_gbs", memcpyGBs}, {"permute_gbs", permuteGBs}, {"combine_gbs", combineGBs},
        {"permute_ratio", permuteGBs / memcpyGBs}, {"combine_ratio", combineGBs / memcpyGBs}});
}

void recoverySection() {
  if (!json)
    printf("# recovery probability: 10 nodes x 6 slots, f = 2, Zipf(1.2) loads; P(every expert survives k node failures)\n"
           "#  %7s %3s %10s %10s %10s\n", "experts", "k", "MRO", "spread", "compact");
  for (int e : {8, 16}) {
    auto r = allocateReplicas(zipfLoad(e, 1.2), 10, 6, 2);
    Placement mro = placeMaxOverlap(r, 10, 6), spread = placeSpread(r, 10, 6), compact = placeCompact(r, 10, 6);
    for (int k = 1; k <= 5; ++k) {
      double a = recoveryProbability(mro, e, k).probability, b = recoveryProbability(spread, e, k).probability,
             c = recoveryProbability(compact, e, k).probability;
      if (!json) printf("   %7d %3d %10.4f %10.4f %10.4f\n", e, k, a, b, c);
      emit({{"section", "recovery"}, {"experts", e}, {"failures", k}, {"mro", a}, {"spread", b}, {"compact", c}});
    }
  }
}

// One rank of the end-to-end job (under eccl-run).
int endToEndWorker(int experts, int k, int64_t tokensPerRank, int64_t hidden, int iterations) {
  ecclComm_t comm;
  if (ecclCommInitFromEnv(&comm) != ecclSuccess) return 1;
  int rank, n;
  ecclCommUserRank(comm, &rank);
  ecclCommCount(comm, &n);
  auto topk = zipfRouting(tokensPerRank, k, experts, 1.1, 1000 + rank);
  std::vector<uint16_t> x(static_cast<size_t>(tokensPerRank) * hidden, 0x3c00);  // bfloat16-sized rows
  std::vector<float> w(topk.size(), 0.5f);
  std::vector<uint16_t> out(x.size());
  // Replicas from the measured load (all ranks route alike): 2 slots per
  // expert on average, at least one each, placed by max overlap.
  std::vector<double> load(experts, 0);
  for (int32_t e : topk) load[e] += 1;
  ecclAllReduce(load.data(), load.data(), experts, ecclFloat64, ecclSum, comm, nullptr);
  const int slots = std::max(1, 2 * experts / n);
  auto reps = allocateReplicas(load, n, slots, 1);
  auto replicas = replicasFromPlacement(placeMaxOverlap(reps, n, slots), experts);
  auto runDispatch = [&] {
    ecclMoePlan_t plan;
    if (ecclMoeDispatch(x.data(), topk.data(), tokensPerRank, k, hidden, ecclBfloat16, replicas.data(), experts, &plan,
                        comm, nullptr) != ecclSuccess) {
      fprintf(stderr, "dispatch: %s\n", ecclGetLastError(comm));
      exit(1);
    }
    void* rows;
    int q;
    const int32_t* le;
    const int64_t *cnt, *off;
    ecclMoeExpertInput(plan, &rows, &q, &le, &cnt, &off);
    if (ecclMoeCombine(plan, rows, w.data(), out.data(), comm, nullptr) != ecclSuccess) {
      fprintf(stderr, "combine: %s\n", ecclGetLastError(comm));
      exit(1);
    }
    int64_t moved = 0;
    for (int i = 0; i < q; ++i) moved += cnt[i];
    ecclMoePlanDestroy(plan);
    return moved;
  };
  // The padded expert-parallel baseline: expert e on rank e % n only;
  // every (rank, expert) pair ships `capacity` rows, the busiest count.
  std::vector<int64_t> mine(experts, 0);
  for (int32_t e : topk) mine[e]++;
  int64_t capacity = *std::max_element(mine.begin(), mine.end());
  ecclAllReduce(&capacity, &capacity, 1, ecclInt64, ecclMax, comm, nullptr);
  const int perRank = (experts + n - 1) / n;
  const size_t paddedRows = static_cast<size_t>(perRank) * capacity;
  std::vector<uint16_t> padSend(paddedRows * n * hidden), padRecv(padSend.size());
  auto runPadded = [&] {
    // Fill each (destination, expert) slot region with the routed rows, rest padding.
    ecclAllToAll(padSend.data(), padRecv.data(), paddedRows * hidden, ecclBfloat16, comm, nullptr);
    ecclAllToAll(padRecv.data(), padSend.data(), paddedRows * hidden, ecclBfloat16, comm, nullptr);
  };
  runDispatch();
  runPadded();
  int64_t movedRows = 0;
  double flexMs = 0, padMs = 0;
  for (int i = 0; i < iterations; ++i) {
    ecclBarrier(comm);
    auto t = Clock::now();
    movedRows = runDispatch();
    flexMs += msSince(t);
    ecclBarrier(comm);
    t = Clock::now();
    runPadded();
    padMs += msSince(t);
  }
  flexMs /= iterations;
  padMs /= iterations;
  double v[2] = {flexMs, padMs};
  ecclAllReduce(v, v, 2, ecclFloat64, ecclMax, comm, nullptr);
  ecclAllReduce(&movedRows, &movedRows, 1, ecclInt64, ecclSum, comm, nullptr);
  if (rank == 0) {
    const double rowBytes = double(hidden) * 2;
    double flexBytes = 2.0 * movedRows * rowBytes;  // there and back
    double padBytes = 2.0 * double(paddedRows) * n * n * rowBytes;
    nlohmann::json j{{"section", "end_to_end"}, {"ranks", n}, {"experts", experts}, {"topk", k},
                     {"tokens_per_rank", tokensPerRank}, {"hidden", hidden}, {"capacity", capacity},
                     {"flex_ms", v[0]}, {"padded_ms", v[1]}, {"flex_bytes", flexBytes}, {"padded_bytes", padBytes}};
    printf("RESULT %s\n", j.dump().c_str());
  }
  ecclCommDestroy(comm);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  eccl::cli::App app{"dispatch_perf: MoE dispatcher costs against memcpy, padded expert parallelism and baseline placements"};
  int ranks = 4, experts = 16, k = 2, iterations = 5;
  int64_t tokens = 2048, hidden = 1024;
  bool worker = false, skipE2e = false;
  std::string launcher = eccl::perf::defaultLauncher();
  app.flag("--json", json, "one JSON object per measurement");
  app.option("--ranks", ranks, "ranks of the end-to-end job").range(2, 64);
  app.option("--experts", experts, "experts in the end-to-end job").range(2, 4096);
  app.option("--topk", k, "experts per token").range(1, 16);
  app.option("--tokens", tokens, "tokens per rank").range(1, 1 << 24);
  app.option("--hidden", hidden, "hidden size (bfloat16 rows)").range(1, 1 << 20);
  app.option("-n,--iterations", iterations, "timed end-to-end iterations").range(1, 100000);
  app.option("--launcher", launcher, "eccl-run to use");
  app.flag("--no-e2e", skipE2e, "skip the multi-process section");
  double hbmGBs = 3350;
  app.option("--hbm-gbs", hbmGBs, "the GPU's memory bandwidth for the CUDA section (H100 SXM: 3350)");
  app.flag("--worker", worker, "(internal) one rank of the end-to-end job");
  if (int status = app.parse(argc, argv); status >= 0) return status;
  if (k > experts) {
    fprintf(stderr, "dispatch_perf: --topk %d exceeds --experts %d\n", k, experts);
    return 2;
  }
  if (worker) return endToEndWorker(experts, k, tokens, hidden, iterations);

  scheduleSection();
  permuteSection();
  eccl::perf::dispatchCudaSection(json, hbmGBs);
  recoverySection();
  if (skipE2e) return 0;
  int status = 0;
  std::string log = eccl::perf::runAndCapture(
      {launcher, "-np", std::to_string(ranks), "--timeout", "600", eccl::perf::selfPath(), "--worker", "--experts",
       std::to_string(experts), "--topk", std::to_string(k), "--tokens", std::to_string(tokens), "--hidden",
       std::to_string(hidden), "-n", std::to_string(iterations)},
      &status);
  auto r = nlohmann::json::parse(eccl::perf::rankZeroResult(log), nullptr, false);
  if (r.is_discarded()) {
    fprintf(stderr, "dispatch_perf: the end-to-end job failed:\n%s", log.c_str());
    return 1;
  }
  if (json) {
    printf("%s\n", r.dump().c_str());
    return 0;
  }
  printf("# end to end: %d ranks, %d experts, top-%d, %" PRId64 " tokens/rank, hidden %" PRId64
         " bf16, Zipf(1.1) routing; dispatch + combine\n",
         ranks, experts, k, tokens, hidden);
  printf("#  %-28s %10s %12s\n", "", "time (ms)", "bytes (MB)");
  printf("   %-28s %10.2f %12.1f\n", "flexible (replicas by load)", r["flex_ms"].get<double>(),
         r["flex_bytes"].get<double>() / 1e6);
  printf("   %-28s %10.2f %12.1f\n", "padded EP (exchanges only)", r["padded_ms"].get<double>(),
         r["padded_bytes"].get<double>() / 1e6);
  printf("   ratio padded/flexible: time %.2fx, bytes %.2fx (capacity %" PRId64 " rows per expert)\n",
         r["padded_ms"].get<double>() / r["flex_ms"].get<double>(),
         r["padded_bytes"].get<double>() / r["flex_bytes"].get<double>(), r["capacity"].get<int64_t>());
  return 0;
}
