// The nccl-tests-style measurement loop, shared by eccl's perf binaries and
// the Open MPI and Gloo peers so every library is measured the same way:
// same flags (-b -e -f -i -n -w -c -o -d -z -r), same columns, same busbw.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "eccl.h"

namespace eccl::perf {

enum class Kind { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kReduce, kAllToAll, kSendRecv };

// What one library offers the driver.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Runs one op; counts as in NCCL (per-rank send count for allgather,
  // per-rank recv count for reduce-scatter, per-peer count for alltoall).
  virtual void run(Kind kind, const void* in, void* out, size_t count, ecclDataType_t type, ecclRedOp_t op,
                   int root) = 0;
  virtual bool supports(ecclDataType_t type, ecclRedOp_t op) const { return true; }
  // Average of a value over ranks (used to report times like nccl-tests -a 1).
  virtual double averageOverRanks(double v) = 0;
  virtual double maxOverRanks(double v) = 0;
  virtual void barrier() = 0;
};

struct Options {
  size_t minBytes = 32 << 20, maxBytes = 32 << 20, stepBytes = 1 << 20;
  double stepFactor = 1;
  int iters = 20, warmup = 5, check = 1, blocking = 1, root = 0;
  std::string op = "sum", type = "float";
  bool json = false;
  bool log = false;  // eccl sendrecv: tee every send into the boundary-send log
};

// A peer program launched by eccl-run (Gloo's, oneCCL's): its rank, the
// job's size, and a token unique to the job for naming a rendezvous file.
// Exits with a usage message when not under eccl-run.
struct EcclRunJob {
  int rank = 0, size = 0;
  std::string token;
};
EcclRunJob ecclRunJob(const std::string& program);

// Parses nccl-tests flags; exits with usage on error.
Options parseOptions(int argc, char** argv, const std::string& program);
// Runs the sweep and prints the table on rank 0. Returns the number of
// wrong elements seen (0 when the check is off).
long runSweep(Backend& backend, Kind kind, const Options& options);

}  // namespace eccl::perf
