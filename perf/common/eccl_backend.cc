#include "perf/common/eccl_backend.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "eccl_config.h"
#if ECCL_HAVE_MPI
#include <mpi.h>
#endif

namespace eccl::perf {
namespace {

void check(ecclResult_t r, ecclComm_t comm, const char* what) {
  if (r == ecclSuccess) return;
  fprintf(stderr, "%s failed: %s: %s\n", what, ecclGetErrorString(r), ecclGetLastError(comm));
  exit(1);
}

class EcclBackend final : public Backend {
 public:
  EcclBackend(ecclComm_t comm, const Options& o) : comm_(comm), log_(o.log) {
    check(ecclCommUserRank(comm, &rank_), comm, "ecclCommUserRank");
    check(ecclCommCount(comm, &size_), comm, "ecclCommCount");
    if (log_) {
      // Two messages of the largest size: each iteration truncates the last.
      ecclLogConfig_t cfg{};
      cfg.size = sizeof(cfg);
      cfg.capacityBytes = 2 * o.maxBytes + (1 << 20);
      check(ecclLogConfigure(comm, &cfg), comm, "ecclLogConfigure");
    }
  }
  std::string name() const override { return log_ ? "eccl+log" : "eccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void run(Kind k, const void* in, void* out, size_t count, ecclDataType_t t, ecclRedOp_t op, int root) override {
    ecclResult_t r = ecclSuccess;
    switch (k) {
      case Kind::kAllReduce: r = ecclAllReduce(in, out, count, t, op, comm_, nullptr); break;
      case Kind::kAllGather: r = ecclAllGather(in, out, count, t, comm_, nullptr); break;
      case Kind::kReduceScatter: r = ecclReduceScatter(in, out, count, t, op, comm_, nullptr); break;
      case Kind::kBroadcast: r = ecclBroadcast(in, out, count, t, root, comm_, nullptr); break;
      case Kind::kReduce: r = ecclReduce(in, out, count, t, op, root, comm_, nullptr); break;
      case Kind::kAllToAll: r = ecclAllToAll(in, out, count, t, comm_, nullptr); break;
      case Kind::kSendRecv:
        if (log_) {
          check(ecclLogSetTag(comm_, ++iteration_, 0), comm_, "ecclLogSetTag");
          check(ecclLogTruncate(comm_, iteration_), comm_, "ecclLogTruncate");
        }
        ecclGroupStart();
        ecclSend(in, count, t, (rank_ + 1) % size_, comm_, nullptr);
        ecclRecv(out, count, t, (rank_ - 1 + size_) % size_, comm_, nullptr);
        r = ecclGroupEnd();
        break;
    }
    check(r, comm_, "collective");
  }
  double averageOverRanks(double v) override { return reduceDouble(v, ecclSum) / size_; }
  double maxOverRanks(double v) override { return reduceDouble(v, ecclMax); }
  void barrier() override { check(ecclBarrier(comm_), comm_, "ecclBarrier"); }

 private:
  double reduceDouble(double v, ecclRedOp_t op) {
    double out = 0;
    check(ecclAllReduce(&v, &out, 1, ecclFloat64, op, comm_, nullptr), comm_, "ecclAllReduce(report)");
    return out;
  }
  ecclComm_t comm_;
  int rank_ = 0, size_ = 1;
  bool log_ = false;
  int64_t iteration_ = 0;
};

}  // namespace

int ecclPerfMain(int argc, char** argv, Kind kind, const char* program) {
  Options o = parseOptions(argc, argv, program);
  ecclComm_t comm = nullptr;
  bool underMpi = getenv("OMPI_COMM_WORLD_SIZE") != nullptr && getenv("ECCL_UNIQUE_ID") == nullptr;
  if (underMpi) {
#if ECCL_HAVE_MPI
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ecclUniqueId id;
    if (rank == 0) check(ecclGetUniqueId(&id), nullptr, "ecclGetUniqueId");
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
    check(ecclCommInitRank(&comm, size, id, rank), nullptr, "ecclCommInitRank");
#else
    fprintf(stderr, "%s: started by mpirun, but this build has no MPI support; use eccl-run\n", program);
    return 2;
#endif
  } else {
    check(ecclCommInitFromEnv(&comm), nullptr, "ecclCommInitFromEnv");
  }
  long wrong;
  {
    EcclBackend backend(comm, o);
    wrong = runSweep(backend, kind, o);
  }
  check(ecclCommDestroy(comm), nullptr, "ecclCommDestroy");
#if ECCL_HAVE_MPI
  if (underMpi) MPI_Finalize();
#endif
  return wrong ? 1 : 0;
}

}  // namespace eccl::perf
