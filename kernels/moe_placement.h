// Where MoE expert replicas live (the Lazarus design): how many replicas
// each expert gets from its load, which nodes host them, how likely a
// placement survives k node failures, and how to move from one placement
// to another with the fewest transfers. Host code; all deterministic
// (Monte-Carlo takes a seed).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace eccl::moe {

// replicas[e]: experts sorted by load ascending get
//   r_e = max(floor(t_e / sum_{e' >= e} t_e' * (N*c - sum_{e' < e} r_e')), f)
// so the total is exactly N*c. Ties in load keep expert order. Throws
// std::invalid_argument if E*f > N*c, a load is negative, or f < 1.
std::vector<int> allocateReplicas(const std::vector<double>& load, int nodes, int slotsPerNode, int minReplicas);

// placement[node] = the experts in its slots (a multiset: an expert may
// sit on one node more than once).
using Placement = std::vector<std::vector<int>>;

// Maximum rank overlap: experts in popularity order (fewest replicas
// first, then id) are taken c at a time; each group's experts all sit on
// one run of r_min nodes of their own (r_min: the group's fewest replicas),
// so the group can only be lost when that whole run fails and the job has
// about E/c minimal failure sets instead of one per expert. Every further
// replica (r_e - r_min, and groups whose run no longer fits) then goes one
// at a time, most replicated expert first, to the node with the most free
// slots that does not hold that expert yet (lowest id first).
Placement placeMaxOverlap(const std::vector<int>& replicas, int nodes, int slotsPerNode);
// Round-robin over nodes, expert by expert (the "spread" baseline).
Placement placeSpread(const std::vector<int>& replicas, int nodes, int slotsPerNode);
// Fill node 0, then node 1, ... expert by expert (the "compact" baseline).
Placement placeCompact(const std::vector<int>& replicas, int nodes, int slotsPerNode);

struct RecoveryEstimate {
  double probability = 0;  // every expert keeps a replica on a surviving node
  double low = 0, high = 0;  // 95% interval (equal to probability when exact)
  bool exact = false;
  uint64_t cases = 0;  // subsets enumerated or samples drawn
};
// Probability that a placement over `nodes` nodes still holds every expert
// after `failures` distinct nodes fail uniformly at random: exact when
// C(nodes, failures) <= exactLimit, else `samples` seeded draws (Wilson
// interval).
RecoveryEstimate recoveryProbability(const Placement& placement, int nexperts, int failures,
                                     uint64_t exactLimit = 2'000'000, uint64_t samples = 200'000, uint64_t seed = 1);

struct Transfer {
  int expert = -1;
  int fromNode = -1;  // physical node that sends the expert's state
  int toNode = -1;    // physical node that receives it
};
struct MigrationPlan {
  std::vector<int> planToPhysical;  // plan node -> physical node
  std::vector<Transfer> transfers;
};
// From `current` (physical node -> experts; an empty vector for a failed
// node, listed in `failed`) to `target` (plan node -> experts, one plan
// node per surviving physical node): physical nodes are matched to plan
// nodes greedily by largest overlap (ties: lowest ids), then each missing
// replica is fetched from a surviving owner, spreading one expert's
// transfers round-robin over all its owners. Throws if an expert has no
// surviving owner or the node counts do not match.
MigrationPlan planMigration(const Placement& current, const std::vector<int>& failed, const Placement& target);

// An EPLB-style physical-to-logical map of one layer (phy2log[p] = logical
// expert of physical slot p; slots laid out rank by rank, equally many per
// rank) as replicas[e * nranks + j], the schedule's input.
std::vector<int32_t> replicasFromPhy2Log(const std::vector<int>& phy2log, int nexperts, int nranks);
// The same for a placement (node == rank).
std::vector<int32_t> replicasFromPlacement(const Placement& placement, int nexperts);

}  // namespace eccl::moe
