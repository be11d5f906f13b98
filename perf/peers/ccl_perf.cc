// Intel oneCCL (CPU) peer: the same sweep on ccl::allreduce or
// ccl::alltoall, launched by eccl-run. oneCCL's own key-value store joins
// the ranks: rank 0 creates it and leaves its address in a file named after
// the job, the others read it. The transport is oneCCL's choice from the
// environment perf/compare sets (CCL_ATL_TRANSPORT=ofi, FI_PROVIDER=tcp, and
// CCL_ATL_SHM=1 for its shared-memory provider).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <oneapi/ccl.hpp>
#include <string>
#include <thread>

#include "perf/common/driver.h"

namespace eccl::perf {
namespace {

class CclBackend final : public Backend {
 public:
  CclBackend(int rank, int size, const std::string& addressFile) {
    ccl::init();
    ccl::kvs::address_type address;
    if (rank == 0) {
      kvs_ = ccl::create_main_kvs();
      address = kvs_->get_address();
      std::string partial = addressFile + ".partial";
      std::ofstream(partial, std::ios::binary).write(reinterpret_cast<const char*>(address.data()), address.size());
      if (std::rename(partial.c_str(), addressFile.c_str()) != 0) throw std::runtime_error("cannot publish " + addressFile);
    } else {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (access(addressFile.c_str(), R_OK) != 0) {
        if (std::chrono::steady_clock::now() > deadline)
          throw std::runtime_error("rank 0 never published oneCCL's store address in " + addressFile);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      std::ifstream(addressFile, std::ios::binary).read(reinterpret_cast<char*>(address.data()), address.size());
      kvs_ = ccl::create_kvs(address);
    }
    comm_.emplace(ccl::create_communicator(size, rank, kvs_));
    if (rank == 0) unlink(addressFile.c_str());
  }
  std::string name() const override { return "oneccl"; }
  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  bool supports(ecclDataType_t t, ecclRedOp_t op) const override { return t == ecclFloat32 && op == ecclSum; }
  void run(Kind k, const void* in, void* out, size_t count, ecclDataType_t, ecclRedOp_t, int) override {
    const auto* send = static_cast<const float*>(in);
    auto* recv = static_cast<float*>(out);
    if (k == Kind::kAllToAll)
      ccl::alltoall(send, recv, count, *comm_).wait();
    else
      ccl::allreduce(send, recv, count, ccl::reduction::sum, *comm_).wait();
  }
  double averageOverRanks(double v) override { return reduce(v, ccl::reduction::sum) / comm_->size(); }
  double maxOverRanks(double v) override { return reduce(v, ccl::reduction::max); }
  void barrier() override { ccl::barrier(*comm_).wait(); }

 private:
  double reduce(double v, ccl::reduction op) {
    double out = 0;
    ccl::allreduce(&v, &out, 1, op, *comm_).wait();
    return out;
  }
  ccl::shared_ptr_class<ccl::kvs> kvs_;
  std::optional<ccl::communicator> comm_;  // ccl::communicator has no empty state
};

}  // namespace
}  // namespace eccl::perf

int main(int argc, char** argv) {
  using namespace eccl::perf;
  Options o = parseOptions(argc, argv, PEER_NAME);
  const EcclRunJob job = ecclRunJob(PEER_NAME);
  try {
    CclBackend backend(job.rank, job.size, "/tmp/eccl-ccl-" + job.token);
    return runSweep(backend, Kind::PEER_KIND, o) ? 1 : 0;
  } catch (const std::exception& e) {
    fprintf(stderr, "%s: rank %d: %s\n", PEER_NAME, job.rank, e.what());
    return 1;
  }
}
