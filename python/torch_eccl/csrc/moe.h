// One MoE dispatch's plan as torch sees it (torch_eccl.moe's handle): the
// expert-major rows, the layout, and the eccl plan the combine and the
// backward passes follow. Every call runs on the process group's driver
// thread, in issue order, like its collectives.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "eccl.h"
#include "process_group.h"

namespace torch_eccl {

class MoePlan {
 public:
  MoePlan(c10::intrusive_ptr<ProcessGroupEccl> pg, ecclMoePlan_t plan)
      : pg_(std::move(pg)), owned_(plan, ecclMoePlanDestroy), plan_(plan) {}
  MoePlan(const MoePlan&) = delete;
  MoePlan& operator=(const MoePlan&) = delete;

  // combine: weights given, [tokens, hidden] sums; weights None, [tokens, k,
  // hidden] (each choice's rows).
  at::Tensor combine(const at::Tensor& expertOutput, const std::optional<at::Tensor>& weights);
  // Rows along the plan ([tokens, hidden] or, perChoice, [tokens, k, hidden])
  // to the expert-major layout of rows().
  at::Tensor dispatchAlong(const at::Tensor& rows, bool perChoice);

  const at::Tensor& rows() const { return rows_; }
  const std::vector<int64_t>& localExperts() const { return localExperts_; }
  const std::vector<int64_t>& expertRows() const { return expertRows_; }
  int64_t tokens() const { return tokens_; }
  int64_t topk() const { return topk_; }
  int64_t epoch() const { return epoch_; }
  // rows_sent, rows_received (to and from other ranks), rows_kept (local first).
  std::map<std::string, int64_t> stats() const;

 private:
  friend class ProcessGroupEccl;
  void checkRows(const at::Tensor& t, int64_t rows, const char* op, const char* what) const;

  c10::intrusive_ptr<ProcessGroupEccl> pg_;
  // The plan lives as long as this object or the rows tensor, which
  // aliases the plan's rows (no copy).
  std::shared_ptr<ecclMoePlan> owned_;
  ecclMoePlan_t plan_;
  at::Tensor rows_;
  std::vector<int64_t> localExperts_, expertRows_;
  int64_t tokens_ = 0, topk_ = 0, hidden_ = 0, epoch_ = 0, rowsTotal_ = 0;
  at::ScalarType dtype_ = at::kFloat;
  at::Device device_ = at::kCPU;
};

}  // namespace torch_eccl

namespace torch_eccl::planner {

// Lazarus's planner (ecclMoe* placement calls); a placement is one list of
// expert ids per node.
using Placement = std::vector<std::vector<int32_t>>;
std::vector<int32_t> allocateReplicas(const std::vector<double>& load, int nodes, int slotsPerNode, int minReplicas);
Placement place(const std::vector<int32_t>& replicas, int nodes, int slotsPerNode, int policy);
std::map<std::string, double> recoveryProbability(const Placement& placement, int slotsPerNode, int experts,
                                                  int failures, uint64_t seed);
// (plan node -> physical node, [(expert, from, to)])
std::pair<std::vector<int32_t>, std::vector<std::tuple<int, int, int>>> planMigration(
    const Placement& current, const std::vector<int>& failed, const Placement& target, int slotsPerNode, int experts);

}  // namespace torch_eccl::planner
