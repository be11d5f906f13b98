// reconfig_perf: what a membership change costs, for N in --sizes.
//
// The driver starts, per N, `eccl-run -np N --standby 2 reconfig_perf
// --worker` and reads one RESULT line from rank 0. Each worker job measures,
// in order:
//   full_init_ms      a fresh N-rank communicator (new id, init, first
//                     allreduce): the stop-and-recreate baseline
//   gloo_init_ms      Gloo's full-mesh context creation at the same N (what
//                     a torchft-style process-group rebuild pays)
// then --cycles migrations of rank 1 to a standby (the leaver registers
// again as a standby, so the pool stays full), each preceded by
// --iterations plain 1 MiB allreduces:
//   prepare_interference_pct
//                     mean 1 MiB allreduce time while a migration is
//                     prepared in the background, against the plain steps,
//                     pooled over every cycle (prepare_steps: how many)
//   migrate_downtime_ms
//                     the job's stall, median over the cycles (each in
//                     migrate_downtime_each_ms): from the moment every
//                     stayer has called ecclCommSwitchover (the job is at
//                     the boundary) to the moment every member has
//                     completed its first allreduce on the new view (one
//                     host, one clock)
//   migrate_rank_downtime_ms
//                     the same per rank, from its own call (max over
//                     ranks, median over cycles); it also counts the wait
//                     for the slowest rank to finish the last collective of
//                     the old view
//   conns_opened/closed/inherited
//                     the first migration's delta, counted at the stayers'
//                     ends
//   qps_opened/closed the same in RDMA queue pairs (0 but over ib)
// and last a failure:
//   failure_detect_ms / failure_recover_ms
//                     SIGKILL of a rank to the survivors' failed op, and
//                     from there through ecclCommRecover(REPLACE) to the
//                     first completed allreduce with the standby
#include "cli/cli.h"
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "eccl.h"
#include "perf/common/launch.h"

#ifdef ECCL_RECONFIG_WITH_GLOO
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#endif


namespace {

using Clock = std::chrono::steady_clock;
constexpr int kLeaver = 1;
constexpr size_t kBigCount = 1 << 18;  // 1 MiB of float32

double msSince(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }
int64_t nowNs() { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(); }

[[noreturn]] void die(const char* what, ecclResult_t r, ecclComm_t comm) {
  fprintf(stderr, "reconfig_perf: %s: %s: %s\n", what, ecclGetErrorString(r), ecclGetLastError(comm));
  exit(1);
}
#define CHECK(call, comm)                     \
  do {                                        \
    ecclResult_t r_ = (call);                 \
    if (r_ != ecclSuccess) die(#call, r_, comm); \
  } while (0)

void smallAllreduce(ecclComm_t comm) {
  float v[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  CHECK(ecclAllReduce(v, v, 8, ecclFloat32, ecclSum, comm, nullptr), comm);
}

template <typename T>
T reduceMax(ecclComm_t comm, T v, ecclDataType_t type) {
  CHECK(ecclAllReduce(&v, &v, 1, type, ecclMax, comm, nullptr), comm);
  return v;
}

// The least advanced preparation state over the ranks: one allreduce.
constexpr int kSomeFailed = 0, kSomePreparing = 1, kAllReady = 2;
int preparationState(ecclComm_t comm) {
  ecclPrepareState_t state;
  CHECK(ecclCommPrepareStatus(comm, &state, nullptr), comm);
  int32_t code = state == ecclPrepareFailed ? kSomeFailed : state == ecclPrepareReady ? kAllReady : kSomePreparing;
  CHECK(ecclAllReduce(&code, &code, 1, ecclInt32, ecclMin, comm, nullptr), comm);
  return code;
}

// The context is returned so it outlives every rank's connection setup
// (a rank that drops its context early resets its peers' pairs).
double glooInitMs(int rank, int n, const std::string& dir, std::shared_ptr<void>* keep) {
#ifdef ECCL_RECONFIG_WITH_GLOO
  auto t = Clock::now();
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(dir);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, n);
  ctx->connectFullMesh(store, device);
  *keep = ctx;
  return msSince(t);
#else
  (void)rank, (void)n, (void)dir, (void)keep;
  return -1;
#endif
}

struct Results {
  double fullInitMs = 0, glooInitMs = -1, detectMs = 0, recoverMs = 0;
  double smallAllreduceMs = 0;  // median 8-float allreduce: the floor under any downtime
  // One entry per migration cycle (rank 0 keeps them: it is never the leaver).
  std::vector<double> migrateMs, migrateRankMs, agreeMs, applyMs;
  // 1 MiB allreduce steps with and without a preparation running, summed
  // over every cycle, as rank 0 saw them (the allreduce synchronises the
  // ranks, so a delay anywhere shows in every rank's step).
  double baseMs = 0, duringMs = 0;
  int baseSteps = 0, duringSteps = 0;
  int64_t opened = 0, closed = 0, inherited = 0;  // the first cycle's delta
  int64_t qpsOpened = 0, qpsClosed = 0;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// Stayers, the joiner and (after the failure) the replacement share these
// collectives; a member that did not measure something contributes zero.
void failurePhase(ecclComm_t comm, int rank, int n, Results& out) {
  // 300 ms: the last migration's leaver registers again as a standby
  // meanwhile, so REPLACE finds the pool full.
  int64_t killAt = rank == 0 ? nowNs() + 300'000'000 : 0;
  CHECK(ecclBroadcast(&killAt, &killAt, 1, ecclInt64, 0, comm, nullptr), comm);
  if (rank == n - 1) {
    std::this_thread::sleep_for(std::chrono::nanoseconds(killAt - nowNs()));
    raise(SIGKILL);
  }
  double detect = 0;
  auto deadline = Clock::now() + std::chrono::seconds(60);
  for (;;) {
    float v[8] = {};
    if (ecclAllReduce(v, v, 8, ecclFloat32, ecclSum, comm, nullptr) != ecclSuccess) {
      detect = (nowNs() - killAt) / 1e6;
      break;
    }
    if (Clock::now() > deadline) die("waiting for the killed rank to be detected", ecclTimeout, comm);
  }
  auto failedAt = Clock::now();
  for (int tries = 0;; ++tries) {
    ecclResult_t r = ecclCommRecover(comm, ecclRecoverReplace);
    if (r == ecclSuccess) break;
    if (r != ecclInvalidUsage || !std::strstr(ecclGetLastError(comm), "standby") || tries == 250)
      die("ecclCommRecover(REPLACE)", r, comm);
    if (tries == 0) fprintf(stderr, "reconfig_perf: no idle standby yet; recover_ms includes the wait\n");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  smallAllreduce(comm);
  double recover = msSince(failedAt);
  out.detectMs = reduceMax(comm, detect, ecclFloat64);
  out.recoverMs = reduceMax(comm, recover, ecclFloat64);
}

// Times are steady-clock nanoseconds: every rank is on this host. Returns
// the cycle just finished (the joiner learns it here).
int migrationResults(ecclComm_t comm, int cycle, int64_t calledNs, int64_t firstDoneNs, bool stayer, Results& out) {
  ecclCommStats_t s{};
  s.size = sizeof(s);
  CHECK(ecclCommGetStats(comm, &s), comm);
  int64_t delta[5] = {0, 0, 0, 0, 0};
  if (stayer) {
    delta[0] = static_cast<int64_t>(s.connectionsPrepared + s.connectionsOpened);
    delta[1] = static_cast<int64_t>(s.connectionsClosed);
    delta[2] = static_cast<int64_t>(s.connectionsInherited);
    delta[3] = static_cast<int64_t>(s.queuePairsPrepared + s.queuePairsOpened);
    delta[4] = static_cast<int64_t>(s.queuePairsClosed);
  }
  CHECK(ecclAllReduce(delta, delta, 5, ecclInt64, ecclSum, comm, nullptr), comm);
  cycle = static_cast<int>(reduceMax<int64_t>(comm, stayer ? cycle : -1, ecclInt64));
  if (cycle == 0) {
    out.opened = delta[0], out.closed = delta[1], out.inherited = delta[2];
    out.qpsOpened = delta[3], out.qpsClosed = delta[4];
  }
  int64_t lastCall = reduceMax<int64_t>(comm, stayer ? calledNs : 0, ecclInt64);
  int64_t lastDone = reduceMax<int64_t>(comm, firstDoneNs, ecclInt64);
  out.migrateMs.push_back((lastDone - lastCall) / 1e6);
  out.migrateRankMs.push_back(reduceMax(comm, stayer ? (firstDoneNs - calledNs) / 1e6 : 0.0, ecclFloat64));
  out.agreeMs.push_back(reduceMax(comm, stayer ? s.agreeMs : 0.0, ecclFloat64));
  out.applyMs.push_back(reduceMax(comm, stayer ? s.applyMs : 0.0, ecclFloat64));
  return cycle;
}

struct Job {
  std::string glooDir;
  int iterations = 10, cycles = 5;
};

int asStandby(ecclComm_t comm, const Job& job, Results& res);

// Migration cycles from `first` on: `iterations` plain 1 MiB steps, then
// rank 0 prepares the migration of rank kLeaver while the steps go on
// until everyone sees READY, then the switchover and a first allreduce on
// the new view. The leaver registers again as a standby, so the pool stays
// full and a later cycle (or the failure) may promote it.
void migrationCycles(ecclComm_t comm, int first, const Job& job, Results& res) {
  int rank;
  CHECK(ecclCommUserRank(comm, &rank), comm);
  std::vector<float> big(kBigCount, 1.0f);
  auto step = [&] {
    auto t0 = Clock::now();
    CHECK(ecclAllReduce(big.data(), big.data(), big.size(), ecclFloat32, ecclSum, comm, nullptr), comm);
    return msSince(t0);
  };
  for (int cycle = first; cycle < job.cycles; ++cycle) {
    // The previous leaver registers again only once the coordinator has
    // released it, which can take a heartbeat: a refusal for want of an
    // idle standby is retried after more baseline steps.
    for (;;) {
      for (int i = 0; i < job.iterations; ++i) {
        res.baseMs += step();
        ++res.baseSteps;
        preparationState(comm);  // the same bookkeeping as the loop below
      }
      if (rank == 0) CHECK(ecclCommPrepare(comm, kLeaver), comm);
      double duringMs = 0;
      int steps = 0, state;
      do {
        duringMs += step();
        if (++steps > 100000) die("the preparation never became ready", ecclTimeout, comm);
      } while ((state = preparationState(comm)) == kSomePreparing);
      if (state == kAllReady) {
        res.duringMs += duringMs, res.duringSteps += steps;
        break;
      }
      const char* why = ecclGetLastError(comm);
      int32_t refused = rank == 0 && std::strstr(why, "no idle standby") != nullptr;
      CHECK(ecclBroadcast(&refused, &refused, 1, ecclInt32, 0, comm, nullptr), comm);
      if (!refused) die("preparation", ecclRemoteError, comm);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    int64_t called = nowNs();
    CHECK(ecclCommSwitchover(comm), comm);
    if (rank == kLeaver) {
      // On a cluster the leaver tears down on its own machine; here it
      // would share the two cores with the first allreduce being timed.
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      CHECK(ecclCommDestroy(comm), nullptr);
      setenv("ECCL_ROLE", "standby", 1);
      CHECK(ecclCommInitFromEnv(&comm), nullptr);
      exit(asStandby(comm, job, res));
    }
    smallAllreduce(comm);
    migrationResults(comm, cycle, called, nowNs(), true, res);
  }
}

// A standby's life once promoted: the joiner of a migration cycle, or the
// replacement of the killed rank.
int asStandby(ecclComm_t comm, const Job& job, Results& res) {
  ecclCommStats_t s{};
  s.size = sizeof(s);
  CHECK(ecclCommGetStats(comm, &s), comm);
  ecclPrepareState_t prep;
  CHECK(ecclCommPrepareStatus(comm, &prep, nullptr), comm);
  if (prep == ecclPreparePreparing || prep == ecclPrepareReady) {
    CHECK(ecclCommSwitchover(comm), comm);
    smallAllreduce(comm);
    int cycle = migrationResults(comm, -1, 0, nowNs(), false, res);
    migrationCycles(comm, cycle + 1, job, res);
    int rank, n;
    CHECK(ecclCommUserRank(comm, &rank), comm);
    CHECK(ecclCommCount(comm, &n), comm);
    failurePhase(comm, rank, n, res);
  } else if (s.joinedEpoch > 1) {  // the survivors' first allreduce with it, and their reports
    smallAllreduce(comm);
    res.detectMs = reduceMax(comm, 0.0, ecclFloat64);
    res.recoverMs = reduceMax(comm, 0.0, ecclFloat64);
  }
  fflush(stdout);
  CHECK(ecclCommDestroy(comm), nullptr);
  return 0;
}

int worker(const Job& job) {
  ecclComm_t comm;
  CHECK(ecclCommInitFromEnv(&comm), nullptr);
  Results res;
  if (std::string(getenv("ECCL_ROLE") ? getenv("ECCL_ROLE") : "") == "standby") return asStandby(comm, job, res);
  int rank, n;
  CHECK(ecclCommUserRank(comm, &rank), comm);
  CHECK(ecclCommCount(comm, &n), comm);

  // Full re-initialisation baseline: a new id, a new N-rank communicator.
  ecclUniqueId id;
  if (rank == 0) CHECK(ecclGetUniqueId(&id), nullptr);
  CHECK(ecclBroadcast(&id, &id, sizeof(id), ecclUint8, 0, comm, nullptr), comm);
  CHECK(ecclBarrier(comm), comm);
  auto t = Clock::now();
  ecclComm_t fresh;
  CHECK(ecclCommInitRank(&fresh, n, id, rank), nullptr);
  smallAllreduce(fresh);
  double full = msSince(t);
  CHECK(ecclCommDestroy(fresh), nullptr);
  res.fullInitMs = reduceMax(comm, full, ecclFloat64);
  CHECK(ecclBarrier(comm), comm);
  std::shared_ptr<void> glooContext;
  res.glooInitMs = reduceMax(comm, job.glooDir.empty() ? -1.0 : glooInitMs(rank, n, job.glooDir, &glooContext),
                             ecclFloat64);
  CHECK(ecclBarrier(comm), comm);
  glooContext.reset();

  std::vector<double> small;
  for (int i = 0; i < 21; ++i) {
    auto t1 = Clock::now();
    smallAllreduce(comm);
    small.push_back(msSince(t1));
  }
  res.smallAllreduceMs = reduceMax(comm, median(small), ecclFloat64);
  migrationCycles(comm, 0, job, res);
  failurePhase(comm, rank, n, res);

  CHECK(ecclCommUserRank(comm, &rank), comm);
  if (rank == 0) {
    double base = res.baseMs / std::max(1, res.baseSteps), during = res.duringMs / std::max(1, res.duringSteps);
    nlohmann::json j{{"n", n},
                     {"cycles", job.cycles},
                     {"full_init_ms", res.fullInitMs},
                     {"migrate_downtime_ms", median(res.migrateMs)},
                     {"migrate_downtime_each_ms", res.migrateMs},
                     {"migrate_rank_downtime_ms", median(res.migrateRankMs)},
                     {"migrate_agree_ms", median(res.agreeMs)},
                     {"migrate_apply_ms", median(res.applyMs)},
                     {"small_allreduce_ms", res.smallAllreduceMs},
                     {"failure_detect_ms", res.detectMs},
                     {"failure_recover_ms", res.recoverMs},
                     {"conns_opened", res.opened},
                     {"conns_closed", res.closed},
                     {"conns_inherited", res.inherited},
                     {"qps_opened", res.qpsOpened},
                     {"qps_closed", res.qpsClosed},
                     {"prepare_interference_pct", (during / base - 1) * 100},
                     {"prepare_steps", res.duringSteps},
                     {"gloo_init_ms", res.glooInitMs < 0 ? nlohmann::json(nullptr) : nlohmann::json(res.glooInitMs)}};
    printf("RESULT %s\n", j.dump().c_str());
    fflush(stdout);
  }
  CHECK(ecclCommDestroy(comm), nullptr);
  return 0;
}

// Runs one eccl-run job and returns rank 0's RESULT object (null if none).
nlohmann::json runJob(const std::string& launcher, const std::string& self, int n, Job job, bool verbose,
                      bool bindCores) {
  std::string& glooDir = job.glooDir;
#ifdef ECCL_RECONFIG_WITH_GLOO
  char tmpl[] = "/tmp/eccl-reconfig-gloo-XXXXXX";
  if (mkdtemp(tmpl)) glooDir = tmpl;
#endif
  std::vector<std::string> args{launcher, "-np", std::to_string(n), "--standby", "2", "--timeout", "300",
                                self, "--worker", "--iterations", std::to_string(job.iterations),
                                "--cycles", std::to_string(job.cycles)};
  if (!glooDir.empty()) args.insert(args.end(), {"--gloo-dir", glooDir});
  if (bindCores) args.insert(args.begin() + 1, "--bind-cores");
  int status = 0;
  std::string log = eccl::perf::runAndCapture(args, &status);
  if (!glooDir.empty()) std::filesystem::remove_all(glooDir);
  nlohmann::json result = nlohmann::json::parse(eccl::perf::rankZeroResult(log), nullptr, false);
  if (result.is_discarded() || verbose) fprintf(stderr, "reconfig_perf: N=%d job output:\n%s", n, log.c_str());
  if (result.is_discarded()) result = nullptr;
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  eccl::cli::App app{"reconfig_perf: the cost of membership changes against full re-initialisation"};
  std::vector<int> sizes{4, 8, 16, 32};
  bool json = false, isWorker = false, verbose = false, bindCores = false;
  Job job;
  std::string launcher = eccl::perf::defaultLauncher();
  app.option("--sizes", sizes, "values of N").delimiter(',').range(3, 1024);
  app.flag("--json", json, "one JSON object per N instead of the table");
  app.option("--iterations", job.iterations, "1 MiB allreduces before each preparation (the interference baseline)")
      .range(1, 100000);
  app.option("--cycles", job.cycles, "migrations per N (medians and pooled interference over them)")
      .range(1, 1000);
  app.option("--launcher", launcher, "eccl-run to use");
  app.flag("-v,--verbose", verbose, "print each job's output");
  app.flag("--bind-cores", bindCores, "pin each process of a job to a core of its own (eccl-run --bind-cores)");
  app.flag("--worker", isWorker, "(internal) one rank of a measurement job");
  app.option("--gloo-dir", job.glooDir, "(internal) Gloo FileStore directory");
  if (int status = app.parse(argc, argv); status >= 0) return status;
  if (isWorker) return worker(job);

  signal(SIGPIPE, SIG_IGN);
  std::string self = eccl::perf::selfPath();
  if (!json) {
    printf("# reconfig_perf: 1 MiB float32 allreduce; migrate = every stayer at the switchover to every member past its\n"
           "# first allreduce on the new view ((rank): from each rank's own call), median of %d migrations;\n"
           "# interfere = 1 MiB allreduce time while preparing vs plain, pooled over them; failure = SIGKILL\n",
           job.cycles);
    printf("# %5s %10s %10s %9s %9s %9s %9s %8s %8s %7s %7s %9s %6s %6s %11s %9s\n", "N", "full_init", "gloo_init",
           "migrate", "(rank)", "(agree)", "allred8", "detect", "recover", "opened", "closed", "inherited", "qps+",
           "qps-", "interfere%", "full/mig");
    printf("# %5s %10s %10s %9s %9s %9s %9s %8s %8s %7s %7s %9s %6s %6s %11s %9s\n", "", "(ms)", "(ms)", "(ms)", "(ms)",
           "(ms)", "(ms)", "(ms)", "(ms)", "", "", "", "", "", "", "");
  }
  int failures = 0;
  for (int n : sizes) {
    nlohmann::json r = runJob(launcher, self, n, job, verbose, bindCores);
    if (r.is_null()) {
      fprintf(stderr, "reconfig_perf: the N=%d job produced no result\n", n);
      ++failures;
      continue;
    }
    if (json) {
      printf("%s\n", r.dump().c_str());
    } else {
      double gloo = r["gloo_init_ms"].is_null() ? -1 : r["gloo_init_ms"].get<double>();
      printf("  %5d %10.2f %10.2f %9.3f %9.3f %9.3f %9.3f %8.2f %8.2f %7" PRId64 " %7" PRId64 " %9" PRId64
             " %6" PRId64 " %6" PRId64 " %11.1f %9.1f\n",
             n, r["full_init_ms"].get<double>(), gloo, r["migrate_downtime_ms"].get<double>(),
             r["migrate_rank_downtime_ms"].get<double>(), r["migrate_agree_ms"].get<double>(), r["small_allreduce_ms"].get<double>(),
             r["failure_detect_ms"].get<double>(), r["failure_recover_ms"].get<double>(),
             r["conns_opened"].get<int64_t>(), r["conns_closed"].get<int64_t>(), r["conns_inherited"].get<int64_t>(),
             r["qps_opened"].get<int64_t>(), r["qps_closed"].get<int64_t>(), r["prepare_interference_pct"].get<double>(),
             r["full_init_ms"].get<double>() / std::max(1e-9, r["migrate_downtime_ms"].get<double>()));
    }
    fflush(stdout);
  }
  return failures ? 1 : 0;
}
