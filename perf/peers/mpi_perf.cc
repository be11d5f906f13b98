// MPI peer: the same sweep as eccl's perf binaries, on MPI_Allreduce or
// MPI_Alltoall (PEER_KIND picks which), launched by the MPI's own mpirun;
// built against Open MPI and, where scripts/setup.sh peers installed it,
// MPICH.
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "perf/common/driver.h"

namespace eccl::perf {
namespace {

MPI_Datatype mpiType(ecclDataType_t t) {
  switch (t) {
    case ecclInt8: return MPI_INT8_T;
    case ecclUint8: return MPI_UINT8_T;
    case ecclInt32: return MPI_INT32_T;
    case ecclUint32: return MPI_UINT32_T;
    case ecclInt64: return MPI_INT64_T;
    case ecclUint64: return MPI_UINT64_T;
    case ecclFloat32: return MPI_FLOAT;
    case ecclFloat64: return MPI_DOUBLE;
    default: return MPI_DATATYPE_NULL;
  }
}

MPI_Op mpiOp(ecclRedOp_t op) {
  switch (op) {
    case ecclSum: return MPI_SUM;
    case ecclProd: return MPI_PROD;
    case ecclMax: return MPI_MAX;
    case ecclMin: return MPI_MIN;
    default: return MPI_OP_NULL;
  }
}

class MpiBackend final : public Backend {
 public:
  MpiBackend() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int length = 0;
    MPI_Get_library_version(version, &length);
    std::string v(version, static_cast<size_t>(length));
    name_ = v.find("MPICH") != std::string::npos ? "mpich" : v.find("Open MPI") != std::string::npos ? "openmpi" : "mpi";
  }
  std::string name() const override { return name_; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool supports(ecclDataType_t t, ecclRedOp_t op) const override {
    return mpiType(t) != MPI_DATATYPE_NULL && mpiOp(op) != MPI_OP_NULL;
  }
  void run(Kind k, const void* in, void* out, size_t count, ecclDataType_t t, ecclRedOp_t op, int) override {
    int rc = MPI_SUCCESS;
    if (k == Kind::kAllReduce)
      rc = MPI_Allreduce(in == out ? MPI_IN_PLACE : in, out, static_cast<int>(count), mpiType(t), mpiOp(op),
                         MPI_COMM_WORLD);
    else
      rc = MPI_Alltoall(in, static_cast<int>(count), mpiType(t), out, static_cast<int>(count), mpiType(t),
                        MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) MPI_Abort(MPI_COMM_WORLD, 1);
  }
  double averageOverRanks(double v) override {
    double s;
    MPI_Allreduce(&v, &s, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return s / size_;
  }
  double maxOverRanks(double v) override {
    double m;
    MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return m;
  }
  void barrier() override { MPI_Barrier(MPI_COMM_WORLD); }

 private:
  int rank_ = 0, size_ = 1;
  std::string name_;
};

}  // namespace
}  // namespace eccl::perf

int main(int argc, char** argv) {
  using namespace eccl::perf;
  Options o = parseOptions(argc, argv, PEER_NAME);
  MPI_Init(&argc, &argv);
  long wrong;
  {
    MpiBackend backend;
    wrong = runSweep(backend, Kind::PEER_KIND, o);
  }
  MPI_Finalize();
  return wrong ? 1 : 0;
}
