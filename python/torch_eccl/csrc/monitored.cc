// What c10d asks of a backend beyond the collectives: the monitored barrier
// (the barrier that names the ranks that did not arrive) and the sparse
// allreduce, as Gloo provides them.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <sstream>

#include "process_group.h"

namespace torch_eccl {

namespace {

// A store every rank of the group shares (not the process-local HashStore
// torch_eccl.init_process_group gives torch under eccl-run).
bool sharedStore(const c10::intrusive_ptr<c10d::Store>& store) {
  if (!store) return false;
  c10::intrusive_ptr<c10d::Store> base = store;
  if (auto* prefix = dynamic_cast<c10d::PrefixStore*>(store.get())) base = prefix->getUnderlyingNonPrefixStore();
  return dynamic_cast<c10d::HashStore*>(base.get()) == nullptr;
}

bool arrivedWithin(c10d::Store& store, const std::string& key, std::chrono::milliseconds wait) {
  try {
    store.wait({key}, std::max(wait, std::chrono::milliseconds(1)));
    return true;
  } catch (const c10::DistStoreError&) {
    return false;
  } catch (const c10::Error& e) {
    if (std::string(e.what()).find("imeout") != std::string::npos) return false;
    throw;
  }
}

}  // namespace

// Over the group's store, not the data lanes: a rank that never arrives
// leaves nothing half-matched on the communicator, which stays usable, and
// a live but late rank is not declared failed. Rank 0 waits for every
// other rank's arrival within the timeout and then releases them, or
// names who did not arrive; the others wait for the release.
void ProcessGroupEccl::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  requireRank("monitored_barrier");
  TORCH_CHECK(sharedStore(store_), "eccl monitored_barrier: the group has no store its ranks share (under eccl-run, "
              "torch_eccl.init_process_group gives torch a local one); use barrier(), whose failure names the rank");
  std::chrono::milliseconds timeout = opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout;
  const std::string prefix = "eccl/monitored_barrier/" + std::to_string(monitoredRounds_++) + "/";
  const int64_t ms = timeout.count();
  if (rank_ != 0) {
    store_->set(prefix + "arrived/" + std::to_string(rank_), "1");
    std::string verdict = "no answer within " + std::to_string(ms) + " ms";
    if (arrivedWithin(*store_, prefix + "released", timeout)) {
      auto bytes = store_->get(prefix + "released");
      verdict.assign(bytes.begin(), bytes.end());
      if (verdict == "ok") return;
    }
    TORCH_CHECK_WITH(DistBackendError, false, "[Rank ", rank_, "]: Rank ", rank_,
                     " successfully reached monitoredBarrier, but received errors while waiting for send/recv "
                     "from rank 0: ", verdict);
  }
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<int> missing;
  for (int r = 1; r < size_; ++r) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    const std::string key = prefix + "arrived/" + std::to_string(r);
    if (!waitAllRanks && left.count() <= 0 && !store_->check({key})) {
      // Rank 0's own time ran out before it got to rank r (Gloo's wording).
      std::ostringstream what;
      what << "[Rank 0]: Rank 0 timed out in monitoredBarrier after " << ms << " ms, before ranks " << r;
      for (int q = r + 1; q < size_; ++q) what << ", " << q;
      what << " had been seen";
      store_->set(prefix + "released", what.str());
      TORCH_CHECK_WITH(DistBackendError, false, what.str());
    }
    bool arrived = missing.empty() ? arrivedWithin(*store_, key, left) : store_->check({key});
    if (!arrived) {
      missing.push_back(r);
      if (!waitAllRanks) break;
    }
  }
  if (missing.empty()) {
    store_->set(prefix + "released", "ok");
    return;
  }
  std::ostringstream what;
  what << "[Rank 0]: " << (missing.size() == 1 ? "Rank " : "Ranks ");
  for (size_t i = 0; i < missing.size(); ++i) what << (i ? ", " : "") << missing[i];
  what << " failed to pass monitoredBarrier in " << ms << " ms";
  store_->set(prefix + "released", what.str());
  TORCH_CHECK_WITH(DistBackendError, false, what.str());
}

// Gloo's method: every rank's coalesced entries are gathered (padded to the
// largest count) and summed by coalescing them in rank order.
c10::intrusive_ptr<c10d::Work> ProcessGroupEccl::allreduceSparse(const at::Tensor& t,
                                                                 const c10d::AllreduceOptions& opts) {
  TORCH_CHECK_VALUE(opts.reduceOp == c10d::ReduceOp::SUM, "eccl allreduce: sparse tensors are reduced with SUM only");
  TORCH_CHECK_VALUE(t.is_cpu() && t.layout() == at::kSparse, "eccl allreduce: sparse tensors must be CPU COO tensors");
  return enqueue(c10d::OpType::ALLREDUCE, "allreduce", {t}, {t}, [this, t] {
    at::Tensor in = t.coalesce();
    at::Tensor indices = in._indices().t().contiguous();  // [nnz, sparse dims]
    at::Tensor values = in._values().contiguous();        // [nnz, dense dims...]
    int64_t nnz = in._nnz();
    std::vector<int64_t> counts(size_);
    check(ecclAllGather(&nnz, counts.data(), 1, ecclInt64, comm_, nullptr), "allreduce (sparse entry counts)");
    int64_t most = *std::max_element(counts.begin(), counts.end());
    auto padded = [&](const at::Tensor& x) {
      std::vector<int64_t> shape = x.sizes().vec();
      shape[0] = most;
      at::Tensor p = at::zeros(shape, x.options());
      if (nnz) p.narrow(0, 0, nnz).copy_(x);
      shape.insert(shape.begin(), size_);
      at::Tensor all = at::empty(shape, x.options());
      check(ecclAllGather(p.data_ptr(), all.data_ptr(), p.numel() * p.element_size(), ecclUint8, comm_, nullptr),
            "allreduce (sparse entries)");
      std::vector<at::Tensor> mine;
      for (int r = 0; r < size_; ++r) mine.push_back(all[r].narrow(0, 0, counts[r]));
      return at::cat(mine);
    };
    at::Tensor allIndices = padded(indices), allValues = padded(values);
    at::Tensor sum = at::sparse_coo_tensor(allIndices.t(), allValues, t.sizes(), t.options()).coalesce();
    t.copy_(sum);
  }, opts.asyncOp);
}

}  // namespace torch_eccl
