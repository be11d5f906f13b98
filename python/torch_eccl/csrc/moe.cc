// torch_eccl.moe's calls into eccl's dispatcher (docs/moe.md): tensors are
// checked on the caller's thread, the eccl calls run on the driver thread.
#include "moe.h"

#include "streams.h"
#include "tensors.h"

namespace torch_eccl {

namespace {

at::Tensor contiguousInt32(const at::Tensor& t) { return t.to(at::kInt).contiguous(); }

}  // namespace

void ProcessGroupEccl::runOnComm(const char* name, const std::vector<at::Tensor>& tensors,
                                 const std::function<void(ecclComm_t)>& run) {
  runNow(name, onCallerStream(tensors, [this, &run] { run(comm_); }));
}

int64_t ProcessGroupEccl::epoch() {
  int64_t out = 0;
  runNow("epoch", [&] {
    ecclCommStats_t s{};
    s.size = sizeof(s);
    check(ecclCommGetStats(comm_, &s), "epoch");
    out = s.epoch;
  });
  return out;
}

std::shared_ptr<MoePlan> ProcessGroupEccl::moeDispatch(const at::Tensor& x, const at::Tensor& topk,
                                                       const at::Tensor& replicas) {
  checkTensor(x, "moe dispatch");
  checkTensor(topk, "moe dispatch");
  checkTensor(replicas, "moe dispatch");
  TORCH_CHECK_VALUE(x.dim() == 2, "eccl moe dispatch: x must be [tokens, hidden], got shape ", x.sizes());
  TORCH_CHECK_VALUE(topk.dim() == 2 && topk.size(0) == x.size(0), "eccl moe dispatch: topk_ids must be [tokens, k] with ",
                    x.size(0), " tokens, got shape ", topk.sizes());
  TORCH_CHECK_TYPE(topk.scalar_type() == at::kInt || topk.scalar_type() == at::kLong,
                   "eccl moe dispatch: topk_ids must be int32 or int64, got ", topk.scalar_type());
  TORCH_CHECK_VALUE(replicas.dim() == 2 && replicas.size(1) == getSize(),
                    "eccl moe dispatch: replicas must be [experts, world] = [E, ", getSize(), "], got shape ",
                    replicas.sizes());
  TORCH_CHECK_VALUE(topk.device() == x.device(), "eccl moe dispatch: topk_ids is on ", topk.device(), ", x on ",
                    x.device());
  const ecclDataType_t type = reductionType(x.scalar_type(), "moe dispatch");
  at::Tensor xs = x.contiguous(), ids = contiguousInt32(topk), table = contiguousInt32(replicas);
  const int64_t tokens = x.size(0), hidden = x.size(1), k = topk.size(1), experts = replicas.size(0);
  if (topk.scalar_type() == at::kLong && ids.numel() > 0) {
    // int64 ids that do not fit int32 would wrap into valid ones.
    auto [lo, hi] = at::aminmax(topk);
    TORCH_CHECK_VALUE(lo.item<int64_t>() >= -1 && hi.item<int64_t>() < experts, "eccl moe dispatch: topk_ids holds ",
                      lo.item<int64_t>() < -1 ? lo.item<int64_t>() : hi.item<int64_t>(), ", outside [-1, ", experts,
                      ") (", experts, " experts)");
  }
  std::shared_ptr<MoePlan> out;
  runNow("moe_dispatch", onCallerStream({xs}, [&] {
           ecclMoePlan_t plan = nullptr;
           check(ecclMoeDispatch(xs.data_ptr(), ids.data_ptr<int32_t>(), tokens, static_cast<int>(k), hidden, type,
                                 table.data_ptr<int32_t>(), static_cast<int>(experts), &plan, comm_, opStream()),
                 "moe dispatch");
           auto p = std::make_shared<MoePlan>(c10::intrusive_ptr<ProcessGroupEccl>::reclaim_copy(this), plan);
           void* rows = nullptr;
           int local = 0;
           const int32_t* localExperts = nullptr;
           const int64_t *expertRows = nullptr, *offsets = nullptr;
           check(ecclMoeExpertInput(plan, &rows, &local, &localExperts, &expertRows, &offsets), "moe dispatch");
           p->localExperts_.assign(localExperts, localExperts + local);
           p->expertRows_.assign(expertRows, expertRows + local);
           for (int q = 0; q < local; ++q) p->rowsTotal_ += expertRows[q];
           p->tokens_ = tokens, p->topk_ = k, p->hidden_ = hidden;
           p->dtype_ = x.scalar_type();
           p->device_ = x.device();
           p->rows_ = p->rowsTotal_ == 0
                          ? at::empty({0, hidden}, x.options())
                          : at::from_blob(rows, {p->rowsTotal_, hidden}, [owner = p->owned_](void*) {}, x.options());
           ecclCommStats_t s{};
           s.size = sizeof(s);
           check(ecclCommGetStats(comm_, &s), "moe dispatch");
           p->epoch_ = s.epoch;
           out = std::move(p);
         }));
  return out;
}

std::map<std::string, int64_t> MoePlan::stats() const {
  ecclMoePlanStats_t s{};
  TORCH_CHECK(ecclMoePlanGetStats(plan_, &s) == ecclSuccess, "eccl moe stats: ", ecclGetLastError(nullptr));
  return {{"rows_sent", s.rowsSent}, {"rows_received", s.rowsReceived}, {"rows_kept", s.rowsKept}};
}

void MoePlan::checkRows(const at::Tensor& t, int64_t rows, const char* op, const char* what) const {
  checkTensor(t, op);
  TORCH_CHECK_TYPE(t.scalar_type() == dtype_, "eccl ", op, ": ", what, " has dtype ", t.scalar_type(),
                   ", the dispatch carried ", dtype_);
  TORCH_CHECK_VALUE(t.device() == device_, "eccl ", op, ": ", what, " is on ", t.device(), ", the dispatch's x on ",
                    device_);
  TORCH_CHECK_VALUE(t.numel() == rows * hidden_, "eccl ", op, ": ", what, " has shape ", t.sizes(), ", expected ", rows,
                    " rows of ", hidden_);
}

at::Tensor MoePlan::combine(const at::Tensor& expertOutput, const std::optional<at::Tensor>& weights) {
  checkRows(expertOutput, rowsTotal_, "moe combine", "the expert output");
  at::Tensor in = expertOutput.contiguous(), w, out;
  if (weights) {
    checkTensor(*weights, "moe combine");
    TORCH_CHECK_VALUE(weights->numel() == tokens_ * topk_, "eccl moe combine: topk_weights has shape ",
                      weights->sizes(), ", expected [", tokens_, ", ", topk_, "]");
    w = weights->to(device_, at::kFloat).contiguous();
    out = at::empty({tokens_, hidden_}, in.options());
  } else {
    out = at::empty({tokens_, topk_, hidden_}, in.options());
  }
  pg_->runOnComm("moe_combine", {in}, [&](ecclComm_t comm) {
    ecclResult_t r = ecclMoeCombine(plan_, in.data_ptr(), weights ? w.data_ptr<float>() : nullptr, out.data_ptr(),
                                    comm, opStream());
    TORCH_CHECK_WITH(DistBackendError, r == ecclSuccess, "eccl moe combine: ", ecclGetLastError(comm));
  });
  return out;
}

at::Tensor MoePlan::dispatchAlong(const at::Tensor& rows, bool perChoice) {
  checkRows(rows, tokens_ * (perChoice ? topk_ : 1), "moe dispatch_along", "rows");
  at::Tensor in = rows.contiguous();
  at::Tensor out = at::empty({rowsTotal_, hidden_}, in.options());
  pg_->runOnComm("moe_dispatch_along", {in}, [&](ecclComm_t comm) {
    ecclResult_t r = ecclMoeDispatchAlong(plan_, in.data_ptr(), perChoice ? 1 : 0, out.data_ptr(), comm, opStream());
    TORCH_CHECK_WITH(DistBackendError, r == ecclSuccess, "eccl moe dispatch_along: ", ecclGetLastError(comm));
  });
  return out;
}

}  // namespace torch_eccl

namespace torch_eccl::planner {

namespace {

void checked(ecclResult_t r, const char* what) {
  TORCH_CHECK_VALUE(r == ecclSuccess, "eccl moe ", what, ": ", ecclGetLastError(nullptr));
}

std::vector<int32_t> toSlots(const Placement& p, int slotsPerNode, const char* what) {
  std::vector<int32_t> slots(p.size() * static_cast<size_t>(slotsPerNode), -1);
  for (size_t n = 0; n < p.size(); ++n) {
    TORCH_CHECK_VALUE(p[n].size() <= static_cast<size_t>(slotsPerNode), "eccl moe ", what, ": node ", n, " holds ",
                      p[n].size(), " experts, more than its ", slotsPerNode, " slots");
    std::copy(p[n].begin(), p[n].end(), slots.begin() + static_cast<ptrdiff_t>(n * slotsPerNode));
  }
  return slots;
}

Placement fromSlots(const std::vector<int32_t>& slots, int nodes, int slotsPerNode) {
  Placement p(static_cast<size_t>(nodes));
  for (int n = 0; n < nodes; ++n)
    for (int s = 0; s < slotsPerNode; ++s)
      if (int32_t e = slots[static_cast<size_t>(n * slotsPerNode + s)]; e >= 0) p[static_cast<size_t>(n)].push_back(e);
  return p;
}

}  // namespace

std::vector<int32_t> allocateReplicas(const std::vector<double>& load, int nodes, int slotsPerNode, int minReplicas) {
  std::vector<int32_t> out(load.size());
  checked(ecclMoeAllocateReplicas(load.data(), static_cast<int>(load.size()), nodes, slotsPerNode, minReplicas,
                                  out.data()),
          "allocate_replicas");
  return out;
}

Placement place(const std::vector<int32_t>& replicas, int nodes, int slotsPerNode, int policy) {
  std::vector<int32_t> slots(static_cast<size_t>(nodes) * std::max(slotsPerNode, 0));
  checked(ecclMoePlace(replicas.data(), static_cast<int>(replicas.size()), nodes, slotsPerNode,
                       static_cast<ecclMoePlacePolicy_t>(policy), slots.data()),
          "place");
  return fromSlots(slots, nodes, slotsPerNode);
}

std::map<std::string, double> recoveryProbability(const Placement& placement, int slotsPerNode, int experts,
                                                  int failures, uint64_t seed) {
  std::vector<int32_t> slots = toSlots(placement, slotsPerNode, "recovery_probability");
  ecclMoeRecovery_t r{};
  checked(ecclMoeRecoveryProbability(slots.data(), static_cast<int>(placement.size()), slotsPerNode, experts,
                                     failures, seed, &r),
          "recovery_probability");
  return {{"probability", r.probability},
          {"low", r.low},
          {"high", r.high},
          {"exact", r.exact},
          {"cases", static_cast<double>(r.cases)}};
}

std::pair<std::vector<int32_t>, std::vector<std::tuple<int, int, int>>> planMigration(
    const Placement& current, const std::vector<int>& failed, const Placement& target, int slotsPerNode,
    int experts) {
  std::vector<int32_t> cur = toSlots(current, slotsPerNode, "plan_migration"),
                       tgt = toSlots(target, slotsPerNode, "plan_migration");
  std::vector<int32_t> planToPhysical(target.size(), -1);
  std::vector<ecclMoeTransfer_t> transfers(static_cast<size_t>(experts) * slotsPerNode * current.size() + 1);
  int n = 0;
  checked(ecclMoePlanMigration(cur.data(), static_cast<int>(current.size()), slotsPerNode, experts, failed.data(),
                               static_cast<int>(failed.size()), tgt.data(), planToPhysical.data(), transfers.data(),
                               static_cast<int>(transfers.size()), &n),
          "plan_migration");
  std::vector<std::tuple<int, int, int>> out;
  for (int i = 0; i < n; ++i) out.emplace_back(transfers[i].expert, transfers[i].fromNode, transfers[i].toNode);
  return {planToPhysical, out};
}

}  // namespace torch_eccl::planner
