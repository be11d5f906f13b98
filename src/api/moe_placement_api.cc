// Lazarus's planner through the C ABI (kernels/moe_placement.h): host
// calls with no communicator. A placement crosses the ABI as a slot table,
// nodes x slotsPerNode expert ids, -1 for an empty slot.
#include <stdexcept>

#include "api/guard.h"
#include "kernels/moe_placement.h"

using eccl::fail;
using eccl::api::guarded;
using eccl::moe::Placement;

namespace {

template <typename F>
void planning(const char* fn, F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    fail(ecclInvalidArgument, "{}: {}", fn, e.what());
  }
}

void checkShape(int nodes, int slotsPerNode, int numExperts, const char* fn) {
  if (nodes < 1 || slotsPerNode < 1 || numExperts < 1)
    fail(ecclInvalidArgument, "{}: need nodes, slotsPerNode and numExperts >= 1 (got {}, {}, {})", fn, nodes,
         slotsPerNode, numExperts);
}

Placement fromSlots(const int32_t* slots, int nodes, int slotsPerNode, int numExperts, const char* fn) {
  if (!slots) fail(ecclInvalidArgument, "{}: a slot table is NULL", fn);
  Placement p(static_cast<size_t>(nodes));
  for (int n = 0; n < nodes; ++n)
    for (int s = 0; s < slotsPerNode; ++s) {
      const int32_t e = slots[n * slotsPerNode + s];
      if (e < -1 || e >= numExperts)
        fail(ecclInvalidArgument, "{}: node {} slot {} holds expert {}, outside [-1, {})", fn, n, s, e, numExperts);
      if (e >= 0) p[static_cast<size_t>(n)].push_back(e);
    }
  return p;
}

void toSlots(const Placement& p, int slotsPerNode, int32_t* slots, const char* fn) {
  for (size_t n = 0; n < p.size(); ++n) {
    if (p[n].size() > static_cast<size_t>(slotsPerNode))
      fail(ecclInternalError, "{}: node {} got {} experts for {} slots", fn, n, p[n].size(), slotsPerNode);
    for (int s = 0; s < slotsPerNode; ++s)
      slots[n * slotsPerNode + s] = static_cast<size_t>(s) < p[n].size() ? p[n][static_cast<size_t>(s)] : -1;
  }
}

}  // namespace

extern "C" {

ecclResult_t ecclMoeAllocateReplicas(const double* load, int numExperts, int nodes, int slotsPerNode,
                                     int minReplicas, int32_t* replicas) {
  return guarded(nullptr, "ecclMoeAllocateReplicas", [&] {
    checkShape(nodes, slotsPerNode, numExperts, "ecclMoeAllocateReplicas");
    if (!load || !replicas) fail(ecclInvalidArgument, "ecclMoeAllocateReplicas: load or replicas is NULL");
    planning("ecclMoeAllocateReplicas", [&] {
      std::vector<int> r = eccl::moe::allocateReplicas(std::vector<double>(load, load + numExperts), nodes,
                                                       slotsPerNode, minReplicas);
      for (int e = 0; e < numExperts; ++e) replicas[e] = r[static_cast<size_t>(e)];
    });
  });
}

ecclResult_t ecclMoePlace(const int32_t* replicas, int numExperts, int nodes, int slotsPerNode,
                          ecclMoePlacePolicy_t policy, int32_t* slots) {
  return guarded(nullptr, "ecclMoePlace", [&] {
    checkShape(nodes, slotsPerNode, numExperts, "ecclMoePlace");
    if (!replicas || !slots) fail(ecclInvalidArgument, "ecclMoePlace: replicas or slots is NULL");
    int64_t total = 0;
    for (int e = 0; e < numExperts; ++e) {
      if (replicas[e] < 1 || replicas[e] > nodes * slotsPerNode)
        fail(ecclInvalidArgument, "ecclMoePlace: expert {} has {} replicas; each needs 1 to {}", e, replicas[e],
             nodes * slotsPerNode);
      total += replicas[e];
    }
    if (total > int64_t(nodes) * slotsPerNode)
      fail(ecclInvalidArgument, "ecclMoePlace: {} replicas do not fit {} nodes x {} slots", total, nodes,
           slotsPerNode);
    std::vector<int> r(replicas, replicas + numExperts);
    planning("ecclMoePlace", [&] {
      Placement p;
      switch (policy) {
        case ecclMoePlaceMaxOverlap: p = eccl::moe::placeMaxOverlap(r, nodes, slotsPerNode); break;
        case ecclMoePlaceSpread: p = eccl::moe::placeSpread(r, nodes, slotsPerNode); break;
        case ecclMoePlaceCompact: p = eccl::moe::placeCompact(r, nodes, slotsPerNode); break;
        default: fail(ecclInvalidArgument, "ecclMoePlace: policy {} is not one of ecclMoePlace*", int(policy));
      }
      toSlots(p, slotsPerNode, slots, "ecclMoePlace");
    });
  });
}

ecclResult_t ecclMoeRecoveryProbability(const int32_t* slots, int nodes, int slotsPerNode, int numExperts,
                                        int failures, uint64_t seed, ecclMoeRecovery_t* out) {
  return guarded(nullptr, "ecclMoeRecoveryProbability", [&] {
    checkShape(nodes, slotsPerNode, numExperts, "ecclMoeRecoveryProbability");
    if (!out) fail(ecclInvalidArgument, "ecclMoeRecoveryProbability: out is NULL");
    if (failures < 0 || failures > nodes)
      fail(ecclInvalidArgument, "ecclMoeRecoveryProbability: {} failures of {} nodes", failures, nodes);
    Placement p = fromSlots(slots, nodes, slotsPerNode, numExperts, "ecclMoeRecoveryProbability");
    planning("ecclMoeRecoveryProbability", [&] {
      eccl::moe::RecoveryEstimate r =
          eccl::moe::recoveryProbability(p, numExperts, failures, 2'000'000, 200'000, seed ? seed : 1);
      out->probability = r.probability;
      out->low = r.low;
      out->high = r.high;
      out->exact = r.exact ? 1 : 0;
      out->cases = r.cases;
    });
  });
}

ecclResult_t ecclMoePlanMigration(const int32_t* currentSlots, int nodes, int slotsPerNode, int numExperts,
                                  const int* failed, int numFailed, const int32_t* targetSlots,
                                  int32_t* planToPhysical, ecclMoeTransfer_t* transfers, int maxTransfers,
                                  int* numTransfers) {
  return guarded(nullptr, "ecclMoePlanMigration", [&] {
    checkShape(nodes, slotsPerNode, numExperts, "ecclMoePlanMigration");
    if (numFailed < 0 || numFailed >= nodes || (numFailed > 0 && !failed))
      fail(ecclInvalidArgument, "ecclMoePlanMigration: {} failed nodes of {}", numFailed, nodes);
    if (!planToPhysical || !numTransfers || (maxTransfers > 0 && !transfers))
      fail(ecclInvalidArgument, "ecclMoePlanMigration: an output is NULL");
    Placement current = fromSlots(currentSlots, nodes, slotsPerNode, numExperts, "ecclMoePlanMigration");
    std::vector<int> dead(failed, failed + numFailed);
    for (int f : dead) {
      if (f < 0 || f >= nodes) fail(ecclInvalidArgument, "ecclMoePlanMigration: failed node {} of {}", f, nodes);
      current[static_cast<size_t>(f)].clear();
    }
    Placement target = fromSlots(targetSlots, nodes - numFailed, slotsPerNode, numExperts, "ecclMoePlanMigration");
    planning("ecclMoePlanMigration", [&] {
      eccl::moe::MigrationPlan m = eccl::moe::planMigration(current, dead, target);
      for (size_t i = 0; i < m.planToPhysical.size(); ++i) planToPhysical[i] = m.planToPhysical[i];
      *numTransfers = static_cast<int>(m.transfers.size());
      if (static_cast<int>(m.transfers.size()) > maxTransfers)
        fail(ecclInvalidArgument, "ecclMoePlanMigration: the plan has {} transfers, room for {}", m.transfers.size(),
             maxTransfers);
      for (size_t i = 0; i < m.transfers.size(); ++i)
        transfers[i] = {m.transfers[i].expert, m.transfers[i].fromNode, m.transfers[i].toNode};
    });
  });
}

}  // extern "C"
