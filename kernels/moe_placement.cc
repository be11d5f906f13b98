#include "kernels/moe_placement.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>

namespace eccl::moe {

namespace {

void checkShape(int nodes, int slotsPerNode, const std::vector<int>& replicas) {
  if (nodes < 1 || slotsPerNode < 1) throw std::invalid_argument("moe placement: nodes and slots per node must be >= 1");
  int64_t total = 0;
  for (size_t e = 0; e < replicas.size(); ++e) {
    if (replicas[e] < 0) throw std::invalid_argument("moe placement: expert " + std::to_string(e) + " has a negative replica count");
    total += replicas[e];
  }
  if (total > int64_t(nodes) * slotsPerNode)
    throw std::invalid_argument("moe placement: " + std::to_string(total) + " replicas do not fit in " +
                                std::to_string(nodes) + " x " + std::to_string(slotsPerNode) + " slots");
}

bool holds(const std::vector<int>& node, int e) { return std::find(node.begin(), node.end(), e) != node.end(); }

// The node with the most free slots, preferring nodes without `e`; -1 if full.
int roomiest(const std::vector<int>& freeSlots, const Placement& p, int e) {
  int best = -1;
  for (int pass = 0; pass < 2 && best < 0; ++pass)
    for (size_t n = 0; n < freeSlots.size(); ++n)
      if (freeSlots[n] > 0 && (pass == 1 || !holds(p[n], e)) && (best < 0 || freeSlots[n] > freeSlots[best]))
        best = static_cast<int>(n);
  return best;
}

uint64_t choose(int n, int k) {
  if (k < 0 || k > n) return 0;
  k = std::min(k, n - k);
  unsigned __int128 r = 1;
  for (int i = 1; i <= k; ++i) {
    r = r * static_cast<unsigned>(n - k + i) / static_cast<unsigned>(i);
    if (r > UINT64_MAX / 2) return UINT64_MAX;
  }
  return static_cast<uint64_t>(r);
}

}  // namespace

std::vector<int> allocateReplicas(const std::vector<double>& load, int nodes, int slotsPerNode, int minReplicas) {
  const int E = static_cast<int>(load.size());
  if (E < 1) throw std::invalid_argument("moe allocation: no experts");
  if (nodes < 1 || slotsPerNode < 1 || minReplicas < 1)
    throw std::invalid_argument("moe allocation: nodes, slots per node and the minimum replicas must be >= 1");
  const int64_t slots = int64_t(nodes) * slotsPerNode;
  if (int64_t(E) * minReplicas > slots)
    throw std::invalid_argument("moe allocation: " + std::to_string(E) + " experts x " + std::to_string(minReplicas) +
                                " replicas exceed " + std::to_string(slots) + " slots");
  for (int e = 0; e < E; ++e)
    if (!(load[e] >= 0)) throw std::invalid_argument("moe allocation: load of expert " + std::to_string(e) + " is negative or NaN");
  std::vector<int> order(E);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return load[a] < load[b]; });
  std::vector<long double> suffix(E + 1, 0);
  for (int k = E - 1; k >= 0; --k) suffix[k] = suffix[k + 1] + load[order[k]];
  std::vector<int> replicas(E);
  int64_t remaining = slots;
  for (int k = 0; k < E; ++k) {
    const int left = E - k;
    int64_t share = suffix[k] > 0 ? static_cast<int64_t>(std::floor(load[order[k]] / suffix[k] * remaining))
                                  : remaining / left;
    if (k == E - 1) share = remaining;  // the most loaded takes what is left: the total is exactly N*c
    // Never starve the experts still to come below the minimum.
    int64_t r = std::min(std::max<int64_t>(share, minReplicas), remaining - int64_t(minReplicas) * (left - 1));
    replicas[order[k]] = static_cast<int>(r);
    remaining -= r;
  }
  return replicas;
}

namespace {

// Places one more replica of `e` on a node that lacks it, moving other
// replicas out of the way if it must: a breadth-first search over nodes,
// where reaching a full node that lacks the incoming expert means evicting
// one of its replicas to a node that lacks that one, until a node with a
// free slot takes the last. Each node is entered once, and each receives an
// expert it lacked, so every node still holds distinct experts afterwards.
// An augmenting path of a bipartite b-matching: when none exists, no
// placement at all gives `e` one more node. Returns whether it placed it.
bool placeOnNewNode(Placement& p, int e, int slotsPerNode) {
  const int nodes = static_cast<int>(p.size());
  std::vector<int> from(nodes, -2), incoming(nodes, -1);  // -2: not reached; -1: a start node
  std::vector<int> queue;
  for (int n = 0; n < nodes; ++n)
    if (!holds(p[n], e)) from[n] = -1, incoming[n] = e, queue.push_back(n);
  for (size_t head = 0; head < queue.size(); ++head) {
    const int n = queue[head];
    if (static_cast<int>(p[n].size()) < slotsPerNode) {
      p[n].push_back(incoming[n]);
      for (int at = n; from[at] >= 0; at = from[at])
        *std::find(p[from[at]].begin(), p[from[at]].end(), incoming[at]) = incoming[from[at]];
      return true;
    }
    for (int f : p[n])
      for (int m = 0; m < nodes; ++m)
        if (from[m] == -2 && !holds(p[m], f)) from[m] = n, incoming[m] = f, queue.push_back(m);
  }
  return false;
}

// Where the groups filled every other node, a late group's replicas can
// land on one node together although other nodes lack that expert (16
// experts x 3 on 4 nodes x 12 slots put experts 12-15 on one node only).
// Every second replica of an expert on one node is taken out and placed
// again on a node that lacks it, others moved aside if needed; only where
// no placement could (more replicas than nodes) does one double up again.
void spreadDuplicates(Placement& p, int slotsPerNode) {
  std::vector<int> waiting;
  for (auto& node : p) {
    std::vector<int> kept;
    for (int e : node) (holds(kept, e) ? waiting : kept).push_back(e);
    node = std::move(kept);
  }
  // The doubled ones last: a replica with no new node to go to now never
  // gets one later, and its slot must not take one another could use.
  std::vector<int> doubled;
  for (int e : waiting)
    if (!placeOnNewNode(p, e, slotsPerNode)) doubled.push_back(e);
  for (int e : doubled) {
    auto roomy = std::find_if(p.begin(), p.end(), [&](const auto& n) { return static_cast<int>(n.size()) < slotsPerNode; });
    roomy->push_back(e);  // a slot freed above
  }
}

}  // namespace

Placement placeMaxOverlap(const std::vector<int>& replicas, int nodes, int slotsPerNode) {
  checkShape(nodes, slotsPerNode, replicas);
  const int E = static_cast<int>(replicas.size());
  std::vector<int> order(E);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return replicas[a] < replicas[b]; });
  Placement p(nodes);
  std::vector<int> freeSlots(nodes, slotsPerNode);
  std::vector<int> extra(E, 0);  // replicas left for the fill
  int cursor = 0;                // next node no group core has used
  for (int g = 0; g < E; g += slotsPerNode) {
    const int end = std::min(E, g + slotsPerNode);
    const int core = replicas[order[g]];  // the group's fewest replicas
    if (core == 0 || cursor + core > nodes) {
      for (int k = g; k < end; ++k) extra[order[k]] = replicas[order[k]];
      continue;
    }
    // The group shares one core run of nodes: its experts can only be lost
    // together, when that whole run fails.
    for (int i = 0; i < core; ++i)
      for (int k = g; k < end; ++k) p[cursor + i].push_back(order[k]), --freeSlots[cursor + i];
    for (int k = g; k < end; ++k) extra[order[k]] = replicas[order[k]] - core;
    cursor += core;
  }
  // The more popular experts' further replicas, most replicated first, one
  // at a time onto the roomiest node that lacks them.
  for (int k = E - 1; k >= 0; --k)
    for (int i = 0; i < extra[order[k]]; ++i) {
      int node = roomiest(freeSlots, p, order[k]);
      p[node].push_back(order[k]), --freeSlots[node];
    }
  spreadDuplicates(p, slotsPerNode);
  return p;
}

Placement placeSpread(const std::vector<int>& replicas, int nodes, int slotsPerNode) {
  checkShape(nodes, slotsPerNode, replicas);
  Placement p(nodes);
  std::vector<int> freeSlots(nodes, slotsPerNode);
  int cursor = 0;
  for (size_t e = 0; e < replicas.size(); ++e)
    for (int i = 0; i < replicas[e]; ++i) {
      while (freeSlots[cursor] == 0) cursor = (cursor + 1) % nodes;
      p[cursor].push_back(static_cast<int>(e)), --freeSlots[cursor];
      cursor = (cursor + 1) % nodes;
    }
  return p;
}

Placement placeCompact(const std::vector<int>& replicas, int nodes, int slotsPerNode) {
  checkShape(nodes, slotsPerNode, replicas);
  Placement p(nodes);
  int node = 0;
  for (size_t e = 0; e < replicas.size(); ++e)
    for (int i = 0; i < replicas[e]; ++i) {
      while (static_cast<int>(p[node].size()) == slotsPerNode) ++node;
      p[node].push_back(static_cast<int>(e));
    }
  return p;
}

RecoveryEstimate recoveryProbability(const Placement& placement, int nexperts, int failures, uint64_t exactLimit,
                                     uint64_t samples, uint64_t seed) {
  const int n = static_cast<int>(placement.size());
  if (n < 1 || n > 64) throw std::invalid_argument("moe recovery: 1 to 64 nodes are supported, got " + std::to_string(n));
  if (failures < 0 || failures > n) throw std::invalid_argument("moe recovery: failures must be in [0, nodes]");
  std::vector<uint64_t> owners(nexperts, 0);
  for (int node = 0; node < n; ++node)
    for (int e : placement[node]) {
      if (e < 0 || e >= nexperts) throw std::invalid_argument("moe recovery: node " + std::to_string(node) + " holds unknown expert " + std::to_string(e));
      owners[e] |= uint64_t(1) << node;
    }
  auto survives = [&](uint64_t failed) {
    for (uint64_t o : owners)
      if ((o & ~failed) == 0) return false;
    return true;
  };
  RecoveryEstimate r;
  uint64_t cases = choose(n, failures);
  if (cases <= exactLimit) {
    uint64_t ok = 0;
    if (failures == 0) {
      ok = survives(0);
    } else {
      // Gosper's hack: every n-bit mask with `failures` bits set, in order.
      uint64_t mask = (uint64_t(1) << failures) - 1, limit = n == 64 ? 0 : uint64_t(1) << n;
      for (uint64_t i = 0; i < cases; ++i) {
        ok += survives(mask);
        uint64_t c = mask & -mask, next = mask + c;
        mask = (((next ^ mask) >> 2) / c) | next;
        if (limit && mask >= limit) break;
      }
    }
    r.exact = true;
    r.cases = cases;
    r.probability = r.low = r.high = static_cast<double>(ok) / static_cast<double>(cases);
    return r;
  }
  std::mt19937_64 rng(seed);
  std::vector<int> nodesList(n);
  uint64_t ok = 0;
  for (uint64_t s = 0; s < samples; ++s) {
    std::iota(nodesList.begin(), nodesList.end(), 0);
    uint64_t failed = 0;
    for (int k = 0; k < failures; ++k) {
      int pick = k + static_cast<int>(rng() % static_cast<uint64_t>(n - k));
      std::swap(nodesList[k], nodesList[pick]);
      failed |= uint64_t(1) << nodesList[k];
    }
    ok += survives(failed);
  }
  const double z = 1.96, m = static_cast<double>(samples), phat = static_cast<double>(ok) / m;
  const double denom = 1 + z * z / m, centre = (phat + z * z / (2 * m)) / denom;
  const double half = z * std::sqrt(phat * (1 - phat) / m + z * z / (4 * m * m)) / denom;
  r.probability = phat;
  r.low = std::max(0.0, centre - half);
  r.high = std::min(1.0, centre + half);
  r.cases = samples;
  return r;
}

MigrationPlan planMigration(const Placement& current, const std::vector<int>& failed, const Placement& target) {
  const int physical = static_cast<int>(current.size());
  std::vector<bool> dead(physical, false);
  for (int f : failed) {
    if (f < 0 || f >= physical) throw std::invalid_argument("moe migration: failed node " + std::to_string(f) + " does not exist");
    dead[f] = true;
  }
  std::vector<int> alive;
  for (int p = 0; p < physical; ++p)
    if (!dead[p]) alive.push_back(p);
  if (alive.size() != target.size())
    throw std::invalid_argument("moe migration: " + std::to_string(alive.size()) + " surviving nodes for a plan of " +
                                std::to_string(target.size()) + " nodes");
  auto overlap = [](std::vector<int> a, std::vector<int> b) {
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    std::vector<int> both;
    std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
    return static_cast<int>(both.size());
  };
  struct Pair {
    int overlap, physical, plan;
  };
  std::vector<Pair> pairs;
  for (int p : alive)
    for (int q = 0; q < static_cast<int>(target.size()); ++q) pairs.push_back({overlap(current[p], target[q]), p, q});
  std::stable_sort(pairs.begin(), pairs.end(), [](const Pair& a, const Pair& b) { return a.overlap > b.overlap; });
  MigrationPlan plan;
  plan.planToPhysical.assign(target.size(), -1);
  std::vector<bool> used(physical, false);
  for (const Pair& pr : pairs)
    if (!used[pr.physical] && plan.planToPhysical[pr.plan] < 0) used[pr.physical] = true, plan.planToPhysical[pr.plan] = pr.physical;
  std::vector<std::vector<int>> owners;  // expert -> surviving physical owners
  for (int p : alive)
    for (int e : current[p]) {
      if (e >= static_cast<int>(owners.size())) owners.resize(e + 1);
      if (owners[e].empty() || owners[e].back() != p) owners[e].push_back(p);
    }
  std::vector<size_t> nextOwner(owners.size(), 0);
  for (int q = 0; q < static_cast<int>(target.size()); ++q) {
    int p = plan.planToPhysical[q];
    std::vector<int> have = current[p], want = target[q];
    std::sort(have.begin(), have.end());
    std::sort(want.begin(), want.end());
    std::vector<int> missing;
    std::set_difference(want.begin(), want.end(), have.begin(), have.end(), std::back_inserter(missing));
    for (int e : missing) {
      if (e < 0 || e >= static_cast<int>(owners.size()) || owners[e].empty())
        throw std::invalid_argument("moe migration: expert " + std::to_string(e) + " has no surviving replica to copy");
      int from = owners[e][nextOwner[e]++ % owners[e].size()];
      plan.transfers.push_back({e, from, p});
    }
  }
  return plan;
}

std::vector<int32_t> replicasFromPhy2Log(const std::vector<int>& phy2log, int nexperts, int nranks) {
  if (nranks < 1 || phy2log.empty() || phy2log.size() % static_cast<size_t>(nranks) != 0)
    throw std::invalid_argument("moe phy2log: " + std::to_string(phy2log.size()) + " physical slots do not split over " +
                                std::to_string(nranks) + " ranks");
  const size_t perRank = phy2log.size() / static_cast<size_t>(nranks);
  std::vector<int32_t> replicas(static_cast<size_t>(nexperts) * nranks, 0);
  for (size_t p = 0; p < phy2log.size(); ++p) {
    int e = phy2log[p];
    if (e < 0 || e >= nexperts)
      throw std::invalid_argument("moe phy2log: slot " + std::to_string(p) + " maps to expert " + std::to_string(e) +
                                  ", outside [0, " + std::to_string(nexperts) + ")");
    replicas[static_cast<size_t>(e) * nranks + p / perRank]++;
  }
  return replicas;
}

std::vector<int32_t> replicasFromPlacement(const Placement& placement, int nexperts) {
  const int n = static_cast<int>(placement.size());
  std::vector<int32_t> replicas(static_cast<size_t>(nexperts) * n, 0);
  for (int node = 0; node < n; ++node)
    for (int e : placement[node]) {
      if (e < 0 || e >= nexperts) throw std::invalid_argument("moe placement: unknown expert " + std::to_string(e));
      replicas[static_cast<size_t>(e) * n + node]++;
    }
  return replicas;
}

}  // namespace eccl::moe
