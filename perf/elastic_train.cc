// The elastic demo (the README's main job): data-parallel training of a
// deterministic synthetic model, one gradient allreduce per step, under
//   eccl-run -np 4 --standby 1 --kill 2@SECONDS elastic_train
// When a rank dies the survivors' allreduce fails naming it; they recover
// (a standby takes the rank), the joiner receives the parameters from a
// survivor, and training goes on. At the end every rank re-runs the same
// training without faults and checks the parameters are equal bit for bit.
#include "cli/cli.h"

#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "eccl.h"

namespace {

using Clock = std::chrono::steady_clock;

double msSince(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

[[noreturn]] void die(const char* what, ecclResult_t r, ecclComm_t comm) {
  fprintf(stderr, "elastic_train: %s: %s: %s\n", what, ecclGetErrorString(r), ecclGetLastError(comm));
  exit(1);
}

struct Model {
  std::vector<float> params;
  int64_t step = 0;
};

Model initialModel(size_t size) {
  Model m;
  m.params.resize(size);
  for (size_t i = 0; i < size; ++i) m.params[i] = std::sin(static_cast<float>(i) * 0.001f);
  return m;
}

// This rank's gradient for its shard of the data: depends only on the
// parameters, the rank and the step, so a replacement computes the same.
void gradient(const Model& m, int rank, std::vector<float>& g) {
  for (size_t i = 0; i < g.size(); ++i) {
    float data = static_cast<float>((i * 31 + static_cast<size_t>(rank) * 7 + static_cast<size_t>(m.step) * 13) % 1000);
    g[i] = data * 1e-4f - 0.05f + m.params[i] * 1e-3f;
  }
}

uint64_t checksum(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  for (float x : v) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    h = (h ^ bits) * 1099511628211ull;
  }
  return h;
}

// After a view change: the highest rank that kept its state sends the
// parameters and the step to everyone (a joiner has none).
ecclResult_t syncState(ecclComm_t comm, Model& m, bool haveState) {
  int rank;
  ecclCommUserRank(comm, &rank);
  int32_t source = haveState ? rank : -1;
  ecclResult_t r = ecclAllReduce(&source, &source, 1, ecclInt32, ecclMax, comm, nullptr);
  if (r != ecclSuccess) return r;
  if (source < 0) {
    fprintf(stderr, "elastic_train: no rank kept the model state\n");
    exit(1);
  }
  r = ecclBroadcast(&m.step, &m.step, 1, ecclInt64, source, comm, nullptr);
  if (r != ecclSuccess) return r;
  return ecclBroadcast(m.params.data(), m.params.data(), m.params.size(), ecclFloat32, source, comm, nullptr);
}

void printRecovery(ecclComm_t comm, double detectMs, double recoverMs) {
  ecclCommStats_t s{};
  s.size = sizeof(s);
  ecclCommGetStats(comm, &s);
  printf("recovered: epoch %u, rank %d of %d; failure surfaced %.1f ms into the step, recovery took %.1f ms "
         "(agree %.1f ms, switch %.1f ms); connections opened %" PRIu64 ", closed %" PRIu64 ", inherited %" PRIu64 "\n",
         s.epoch, s.rank, s.nranks, detectMs, recoverMs, s.agreeMs, s.applyMs, s.connectionsOpened,
         s.connectionsClosed, s.connectionsInherited);
}

// Expected migration (ecclcoord migrate --rank R): at each step boundary
// the ranks agree whether the preparation is READY everywhere; if so the
// leaver streams the model to its joiner and every rank switches over.
// Returns true on the leaver, which is then out of the job.
bool maybeSwitchOver(ecclComm_t comm, const Model& m, int rank) {
  ecclPrepareState_t state;
  int leaving = -1;
  ecclResult_t r = ecclCommPrepareStatus(comm, &state, &leaving);
  if (r != ecclSuccess) die("ecclCommPrepareStatus", r, comm);
  int32_t ready = state == ecclPrepareReady;
  r = ecclAllReduce(&ready, &ready, 1, ecclInt32, ecclMin, comm, nullptr);
  if (r != ecclSuccess || !ready) return false;  // a failure surfaces at the next step
  auto t = Clock::now();
  if (leaving == rank) {
    if ((r = ecclMigrationSend(&m.step, 1, ecclInt64, comm, nullptr)) != ecclSuccess ||
        (r = ecclMigrationSend(m.params.data(), m.params.size(), ecclFloat32, comm, nullptr)) != ecclSuccess)
      die("streaming the model to the joiner", r, comm);
  }
  r = ecclCommSwitchover(comm);
  if (r != ecclSuccess) die("ecclCommSwitchover", r, comm);
  ecclCommStats_t s{};
  s.size = sizeof(s);
  ecclCommGetStats(comm, &s);
  if (leaving == rank) {
    printf("rank %d migrated to a standby at step %" PRId64 " (state streamed, switched in %.1f ms); leaving\n", rank,
           m.step, msSince(t));
    return true;
  }
  printf("switched over at step %" PRId64 " to epoch %u in %.1f ms (agree %.1f ms, switch %.1f ms); connections "
         "prepared %" PRIu64 " in %.1f ms, opened at the switch %" PRIu64 ", closed %" PRIu64 ", inherited %" PRIu64 "\n",
         m.step, s.epoch, msSince(t), s.agreeMs, s.applyMs, s.connectionsPrepared, s.prepareMs, s.connectionsOpened,
         s.connectionsClosed, s.connectionsInherited);
  return false;
}

// Trains until `steps`; with `elastic`, survives failures by recovering and
// follows expected migrations. Returns false if this rank migrated away.
bool train(ecclComm_t comm, Model& m, int64_t steps, int stepMs, bool elastic, bool verbose) {
  int rank, n;
  ecclCommUserRank(comm, &rank);
  ecclCommCount(comm, &n);
  std::vector<float> g(m.params.size());
  const float lr = 0.1f;
  while (m.step < steps) {
    auto start = Clock::now();
    gradient(m, rank, g);
    ecclResult_t r = ecclAllReduce(g.data(), g.data(), g.size(), ecclFloat32, ecclSum, comm, nullptr);
    if (r != ecclSuccess) {
      if (!elastic) die("allreduce", r, comm);
      double detect = msSince(start);
      printf("step %" PRId64 " failed after %.1f ms: %s\n", m.step, detect, ecclGetLastError(comm));
      auto t = Clock::now();
      r = ecclCommRecover(comm, ecclRecoverReplaceOrShrink);
      if (r != ecclSuccess) die("ecclCommRecover", r, comm);
      r = syncState(comm, m, true);
      if (r != ecclSuccess) die("state transfer after recovery", r, comm);
      ecclCommUserRank(comm, &rank);
      ecclCommCount(comm, &n);
      printRecovery(comm, detect, msSince(t));
      continue;  // redo the step on the new view
    }
    for (size_t i = 0; i < g.size(); ++i) m.params[i] -= lr * g[i] / static_cast<float>(n);
    ++m.step;
    if (verbose && rank == 0)
      printf("step %" PRId64 "/%" PRId64 " on %d ranks: checksum %016" PRIx64 " (%.1f ms)\n", m.step, steps, n,
             checksum(m.params), msSince(start));
    fflush(stdout);
    if (elastic && maybeSwitchOver(comm, m, rank)) return false;
    if (stepMs > 0) std::this_thread::sleep_for(std::chrono::milliseconds(stepMs));
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  eccl::cli::App app{"elastic_train: data-parallel training that survives a killed rank"};
  int64_t steps = 30;
  size_t size = 1 << 18;
  int stepMs = 100;
  app.option("--steps", steps, "training steps").range(1, 1000000);
  app.option("--size", size, "parameters (float32)").range(1, 1 << 28);
  app.option("--step-ms", stepMs, "pause after each step, so a fault lands mid-run");
  if (int status = app.parse(argc, argv); status >= 0) return status;

  auto t0 = Clock::now();
  ecclComm_t comm;
  ecclResult_t r = ecclCommInitFromEnv(&comm);
  if (r != ecclSuccess) die("ecclCommInitFromEnv", r, nullptr);
  ecclCommStats_t s{};
  s.size = sizeof(s);
  ecclCommGetStats(comm, &s);
  Model model = initialModel(size);
  if (s.joinedEpoch > s.epoch) {
    // The joiner of a migration: it holds the next view's epoch until its
    // switchover. (Every member sees the preparation in its status, one
    // that starts while a migration is announced right after init, so the
    // status cannot tell the joiner.) The leaver streams the model at the
    // boundary, then we switch.
    printf("standby chosen to take rank %d; waiting for its state\n", s.rank);
    auto t = Clock::now();
    if ((r = ecclMigrationRecv(&model.step, 1, ecclInt64, comm, nullptr)) != ecclSuccess ||
        (r = ecclMigrationRecv(model.params.data(), model.params.size(), ecclFloat32, comm, nullptr)) != ecclSuccess)
      die("receiving the model from the leaver", r, comm);
    if ((r = ecclCommSwitchover(comm)) != ecclSuccess) die("ecclCommSwitchover", r, comm);
    printf("joined as rank %d at step %" PRId64 " (%.1f ms after the preparation was announced)\n", s.rank,
           model.step, msSince(t));
  } else if (s.joinedEpoch > 1) {
    printf("standby promoted to rank %d at epoch %u after %.1f ms on standby\n", s.rank, s.epoch, msSince(t0));
    auto t = Clock::now();
    r = syncState(comm, model, false);
    if (r != ecclSuccess) die("receiving the model", r, comm);
    printf("received the model at step %" PRId64 " in %.1f ms\n", model.step, msSince(t));
  }
  if (!train(comm, model, steps, stepMs, true, true)) {
    ecclCommDestroy(comm);
    return 0;
  }

  // The check: the same training from scratch with no fault, same view size.
  Model reference = initialModel(size);
  train(comm, reference, steps, 0, false, false);
  int rank, n;
  ecclCommUserRank(comm, &rank);
  ecclCommCount(comm, &n);
  bool same = std::memcmp(reference.params.data(), model.params.data(), size * sizeof(float)) == 0;
  int32_t allSame = same ? 1 : 0;
  r = ecclAllReduce(&allSame, &allSame, 1, ecclInt32, ecclMin, comm, nullptr);
  if (r != ecclSuccess) die("final check", r, comm);
  if (rank == 0)
    printf("final parameters %s a failure-free run bit for bit on every rank (checksum %016" PRIx64 ", %d ranks)\n",
           allSame ? "equal" : "DIFFER FROM", checksum(model.params), n);
  ecclCommDestroy(comm);
  return allSame ? 0 : 1;
}
