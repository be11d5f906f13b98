// Gloo peer: the same sweep on Gloo's TCP transport, launched by eccl-run.
// --algo ring|hd picks AllreduceRing or AllreduceHalvingDoubling; Gloo's
// legacy allreduce works in place, so out-of-place runs copy first (as
// PyTorch's Gloo backend does).
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/alltoall.h>
#include <gloo/barrier_all_to_one.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "perf/common/driver.h"

namespace eccl::perf {
namespace {

class GlooBackend final : public Backend {
 public:
  GlooBackend(int rank, int size, const std::string& storeDir, std::string algo) : algo_(std::move(algo)) {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(storeDir);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    ctx->connectFullMesh(store, device);
    context_ = ctx;
  }
  std::string name() const override { return "gloo-" + algo_; }
  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }
  bool supports(ecclDataType_t t, ecclRedOp_t op) const override { return t == ecclFloat32 && op == ecclSum; }
  void run(Kind k, const void* in, void* out, size_t count, ecclDataType_t, ecclRedOp_t, int) override {
    if (k == Kind::kAllToAll) {
      gloo::AlltoallOptions opts(context_);
      opts.setInput(const_cast<float*>(static_cast<const float*>(in)), count * context_->size);
      opts.setOutput(static_cast<float*>(out), count * context_->size);
      gloo::alltoall(opts);
      return;
    }
    if (in != out) std::memcpy(out, in, count * sizeof(float));
    auto key = std::make_pair(out, count);
    auto it = algorithms_.find(key);
    if (it == algorithms_.end()) {
      std::vector<float*> ptrs{static_cast<float*>(out)};
      std::unique_ptr<gloo::Algorithm> a;
      if (algo_ == "hd")
        a = std::make_unique<gloo::AllreduceHalvingDoubling<float>>(context_, ptrs, static_cast<int>(count));
      else
        a = std::make_unique<gloo::AllreduceRing<float>>(context_, ptrs, static_cast<int>(count));
      it = algorithms_.emplace(key, std::move(a)).first;
    }
    it->second->run();
  }
  double averageOverRanks(double v) override { return allreduceScalar(v) / context_->size; }
  double maxOverRanks(double v) override {
    // Non-negative counts and times: the max is needed only to detect any
    // non-zero, and the sum does that too.
    return allreduceScalar(v);
  }
  void barrier() override { gloo::BarrierAllToOne(context_).run(); }

 private:
  double allreduceScalar(double v) {
    std::vector<double*> ptrs{&v};
    gloo::AllreduceRing<double>(context_, ptrs, 1).run();
    return v;
  }
  std::string algo_;
  std::shared_ptr<gloo::Context> context_;
  std::map<std::pair<void*, size_t>, std::unique_ptr<gloo::Algorithm>> algorithms_;
};

}  // namespace
}  // namespace eccl::perf

int main(int argc, char** argv) {
  using namespace eccl::perf;
  std::string algo = "ring";
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--algo" && i + 1 < argc) algo = argv[++i];
    else rest.push_back(argv[i]);
  }
  if (algo != "ring" && algo != "hd") {
    fprintf(stderr, "%s: --algo must be ring or hd\n", PEER_NAME);
    return 2;
  }
  Options o = parseOptions(static_cast<int>(rest.size()), rest.data(), PEER_NAME);
  const EcclRunJob job = ecclRunJob(PEER_NAME);
  // The job's unique id names a fresh rendezvous directory for the FileStore.
  std::string dir = "/tmp/eccl-gloo-" + job.token;
  mkdir(dir.c_str(), 0700);
  GlooBackend backend(job.rank, job.size, dir, algo);
  long wrong = runSweep(backend, Kind::PEER_KIND, o);
  return wrong ? 1 : 0;
}
