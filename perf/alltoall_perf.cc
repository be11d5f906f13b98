#include "perf/common/eccl_backend.h"

int main(int argc, char** argv) {
  return eccl::perf::ecclPerfMain(argc, argv, eccl::perf::Kind::kAllToAll, "alltoall_perf");
}
