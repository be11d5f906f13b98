#pragma once

#include "perf/common/driver.h"

namespace eccl::perf {

// main() of every eccl perf binary: starts under eccl-run (environment) or
// under mpirun (rank 0 makes the unique id and MPI broadcasts it).
int ecclPerfMain(int argc, char** argv, Kind kind, const char* program);

}  // namespace eccl::perf
