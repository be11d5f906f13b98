#include "kernels/moe_schedule.h"

#include <algorithm>
#include <stdexcept>

namespace eccl::moe {

namespace {

void validate(const ScheduleInput& in) {
  if (in.nranks < 1 || in.nexperts < 1 || !in.tokens || !in.replicas)
    throw std::invalid_argument("moe schedule: need nranks >= 1, nexperts >= 1 and both count tables");
}

[[noreturn]] void throwNegativeToken(const ScheduleInput& in) {
  for (int j = 0; j < in.nranks; ++j)
    for (int e = 0; e < in.nexperts; ++e)
      if (in.tokens[static_cast<size_t>(j) * in.nexperts + e] < 0)
        throw std::invalid_argument("moe schedule: tokens[" + std::to_string(j) + "][" + std::to_string(e) +
                                    "] is negative");
  throw std::logic_error("moe schedule: a negative token count vanished");
}

// Per expert, its replica hosts in rank order with what each keeps locally
// and where its residual capacity starts in the receivers' layout. Replicas
// are sparse (a few hosts per expert), so this is small next to the table.
struct Hosts {
  std::vector<int32_t> first;               // [E + 1]: hosts of e are [first[e], first[e + 1])
  std::vector<int32_t> rank;                // host ranks, ascending per expert
  std::vector<int64_t> keep, keepBefore;    // kept locally; kept by the expert's earlier hosts
  std::vector<int64_t> residBefore;         // [hosts + E]: per expert, exclusive prefix plus its total

  void build(const ScheduleInput& in, const std::vector<int64_t>& total) {
    const int n = in.nranks, E = in.nexperts;
    first.assign(E + 1, 0);
    rank.clear(), keep.clear(), keepBefore.clear(), residBefore.clear();
    for (int e = 0; e < E; ++e) {
      const int32_t* reps = in.replicas + static_cast<size_t>(e) * n;
      int64_t replicas = 0;
      for (int j = 0; j < n; ++j) {
        if (!reps[j]) continue;
        if (reps[j] < 0)
          throw std::invalid_argument("moe schedule: replicas[" + std::to_string(e) + "][" + std::to_string(j) +
                                      "] is negative");
        rank.push_back(j);
        replicas += reps[j];
      }
      first[e + 1] = static_cast<int32_t>(rank.size());
      if (total[e] > 0 && replicas == 0)
        throw std::invalid_argument("moe schedule: expert " + std::to_string(e) + " has " + std::to_string(total[e]) +
                                    " tokens and no replica");
      const int64_t quota = replicas ? total[e] / replicas : 0, extra = replicas ? total[e] % replicas : 0;
      int64_t repsBefore = 0, kept = 0, resid = 0;
      for (int k = first[e]; k < first[e + 1]; ++k) {
        const int64_t r = reps[rank[k]];
        const int64_t cap = r * quota + std::clamp<int64_t>(extra - repsBefore, 0, r);
        repsBefore += r;
        const int64_t keepHere = std::min(in.tokens[static_cast<size_t>(rank[k]) * E + e], cap);
        keep.push_back(keepHere);
        keepBefore.push_back(kept);
        residBefore.push_back(resid);
        kept += keepHere;
        resid += cap - keepHere;
      }
      residBefore.push_back(resid);
    }
  }
  // Expert e's entries start at first[e] + e (each earlier expert adds its
  // hosts and one end entry); host k (an index into `rank`) is at k + e.
  size_t residIndex(int e, int k) const { return static_cast<size_t>(k) + e; }
  // The expert's host entry for rank j, or -1.
  int find(int e, int j) const {
    auto b = rank.begin() + first[e], en = rank.begin() + first[e + 1];
    auto it = std::lower_bound(b, en, j);
    return it != en && *it == j ? static_cast<int>(it - rank.begin()) : -1;
  }
};

}  // namespace

RankSchedule computeSchedule(const ScheduleInput& in, int rank) {
  RankSchedule s;
  computeSchedule(in, rank, &s);
  return s;
}

// Three passes, each O(E * N) at most: one row-major sweep of the token
// table (totals per expert, and the column sums above this rank: where its
// overflow starts), the sparse replica hosts, and, only for the experts this
// rank hosts with room left, a second sweep that walks the senders'
// overflow intervals across its own.
void computeSchedule(const ScheduleInput& in, int rank, RankSchedule* out) {
  validate(in);
  if (rank < 0 || rank >= in.nranks)
    throw std::invalid_argument("moe schedule: rank " + std::to_string(rank) + " is outside [0, " +
                                std::to_string(in.nranks) + ")");
  const int n = in.nranks, E = in.nexperts;
  RankSchedule& s = *out;
  s.rank = rank;
  s.send.assign(static_cast<size_t>(E) * n, 0);
  s.sendToRank.assign(n, 0);
  s.recvFromRank.assign(n, 0);
  s.localExperts.clear();
  s.recv.clear();
  // Scratch reused across calls on this thread: a schedule is computed
  // every step, and fresh pages would cost more than the arithmetic.
  thread_local std::vector<int64_t> total, above;
  thread_local Hosts hosts;
  total.assign(E, 0);
  int64_t signs = 0;
  for (int j = 0; j < n; ++j) {
    if (j == rank) above = total;
    const int64_t* row = in.tokens + static_cast<size_t>(j) * E;
    for (int e = 0; e < E; ++e) total[e] += row[e], signs |= row[e];
  }
  if (signs < 0) throwNegativeToken(in);
  hosts.build(in, total);

  // Sending: this rank's overflow interval against the hosts' residual ones.
  const int64_t* mine = in.tokens + static_cast<size_t>(rank) * E;
  struct Receiving {
    int e, row;  // the expert and its row in s.recv
    int64_t start, end;
  };
  thread_local std::vector<Receiving> receiving;
  receiving.clear();
  for (int e = 0; e < E; ++e) {
    const int self = hosts.find(e, rank);
    int64_t keptBefore;
    if (self >= 0) {
      keptBefore = hosts.keepBefore[self];
    } else {
      // Hosts below this rank kept what they kept; binary search the rank.
      const int k = static_cast<int>(std::lower_bound(hosts.rank.begin() + hosts.first[e],
                                                      hosts.rank.begin() + hosts.first[e + 1], rank) -
                                     hosts.rank.begin());
      keptBefore = k < hosts.first[e + 1] ? hosts.keepBefore[k]
                   : k > hosts.first[e]   ? hosts.keepBefore[k - 1] + hosts.keep[k - 1]
                                          : 0;
    }
    const int64_t keep = self >= 0 ? hosts.keep[self] : 0;
    int64_t* row = &s.send[static_cast<size_t>(e) * n];
    row[rank] = keep;
    s.sendToRank[rank] += keep;
    const int64_t start = above[e] - keptBefore, end = start + mine[e] - keep;
    if (end > start) {
      // First host whose residual interval ends after `start`.
      const auto* rb = hosts.residBefore.data() + hosts.residIndex(e, hosts.first[e]);
      const int count = hosts.first[e + 1] - hosts.first[e];
      int k = static_cast<int>(std::upper_bound(rb + 1, rb + count + 1, start) - rb) - 1;
      for (; k < count && rb[k] < end; ++k) {
        const int64_t lo = std::max(rb[k], start), hi = std::min(rb[k + 1], end);
        if (hi <= lo) continue;
        const int j = hosts.rank[hosts.first[e] + k];
        row[j] += hi - lo;
        s.sendToRank[j] += hi - lo;
      }
    }
    if (self < 0) continue;
    s.localExperts.push_back(e);
    s.recv.resize(s.recv.size() + n, 0);
    s.recv[s.recv.size() - n + rank] = keep;
    s.recvFromRank[rank] += keep;
    const int64_t rstart = hosts.residBefore[hosts.residIndex(e, self)];
    const int64_t rend = hosts.residBefore[hosts.residIndex(e, self) + 1];
    if (rend > rstart) receiving.push_back({e, static_cast<int>(s.localExperts.size() - 1), rstart, rend});
  }
  if (receiving.empty()) return;

  // Receiving: walk every sender's overflow, in rank order, across this
  // rank's residual interval for each expert it hosts with room left.
  struct Walk {
    int64_t cum = 0;
    int nextHost;
  };
  thread_local std::vector<Walk> walks;
  walks.assign(receiving.size(), Walk{});
  for (size_t x = 0; x < receiving.size(); ++x) walks[x].nextHost = hosts.first[receiving[x].e];
  size_t open = receiving.size();
  for (int j = 0; j < n && open; ++j) {
    const int64_t* row = in.tokens + static_cast<size_t>(j) * E;
    for (size_t x = 0; x < receiving.size(); ++x) {
      const Receiving& r = receiving[x];
      Walk& w = walks[x];
      if (w.cum >= r.end) continue;
      int64_t over = row[r.e];
      if (w.nextHost < hosts.first[r.e + 1] && hosts.rank[w.nextHost] == j) over -= hosts.keep[w.nextHost++];
      const int64_t lo = std::max(w.cum, r.start), hi = std::min(w.cum + over, r.end);
      w.cum += over;
      if (hi > lo) {
        s.recv[static_cast<size_t>(r.row) * n + j] += hi - lo;
        s.recvFromRank[j] += hi - lo;
      }
      if (w.cum >= r.end) --open;
    }
  }
}

std::vector<int64_t> computeGlobalSchedule(const ScheduleInput& in) {
  validate(in);
  const int n = in.nranks, E = in.nexperts;
  std::vector<int64_t> all(static_cast<size_t>(n) * E * n, 0);
  for (int i = 0; i < n; ++i) {
    RankSchedule s = computeSchedule(in, i);
    std::copy(s.send.begin(), s.send.end(), all.begin() + static_cast<ptrdiff_t>(i) * E * n);
  }
  return all;
}

}  // namespace eccl::moe
