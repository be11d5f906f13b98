#include "kernels/moe_schedule.h"

#include <algorithm>
#include <stdexcept>

namespace eccl::moe {

namespace {

void validate(const ScheduleInput& in) {
  if (in.nranks < 1 || in.nexperts < 1 || !in.tokens || !in.replicas)
    throw std::invalid_argument("moe schedule: need nranks >= 1, nexperts >= 1 and both count tables");
}

// A block of up to kBlock experts at once (so the [rank][expert] token
// table is read a cache line at a time): per expert, each rank's local
// share and the exclusive prefix sums of the senders' overflow and the
// receivers' residual capacity (N + 1 entries), so each rank finds its
// overlaps by binary search.
constexpr int kBlock = 8;

struct ExpertSplit {
  // local[b][j] is only meaningful where rank j hosts a replica (else 0).
  std::vector<int64_t> local[kBlock], overPrefix[kBlock], residPrefix[kBlock];

  void resize(int n) {
    for (int b = 0; b < kBlock; ++b) local[b].resize(n), overPrefix[b].resize(n + 1), residPrefix[b].resize(n + 1);
  }

  // totals[e]: all tokens routed to e (one row-major sweep beforehand).
  void compute(const ScheduleInput& in, const int64_t* totals, int e0, int nb) {
    const int n = in.nranks, E = in.nexperts;
    int64_t total[kBlock], replicas[kBlock] = {}, quota[kBlock], extra[kBlock], before[kBlock] = {};
    for (int b = 0; b < nb; ++b) total[b] = totals[e0 + b];
    for (int b = 0; b < nb; ++b) {
      const int e = e0 + b;
      const int32_t* reps = in.replicas + static_cast<size_t>(e) * n;
      for (int j = 0; j < n; ++j) {
        if (reps[j] < 0)
          throw std::invalid_argument("moe schedule: replicas[" + std::to_string(e) + "][" + std::to_string(j) + "] is negative");
        replicas[b] += reps[j];
      }
      if (total[b] > 0 && replicas[b] == 0)
        throw std::invalid_argument("moe schedule: expert " + std::to_string(e) + " has " + std::to_string(total[b]) +
                                    " tokens and no replica");
      quota[b] = replicas[b] ? total[b] / replicas[b] : 0;
      extra[b] = replicas[b] ? total[b] % replicas[b] : 0;
      overPrefix[b][0] = residPrefix[b][0] = 0;
    }
    int64_t over[kBlock] = {}, resid[kBlock] = {};
    for (int j = 0; j < n; ++j) {
      const int64_t* row = in.tokens + static_cast<size_t>(j) * E + e0;
      for (int b = 0; b < nb; ++b) {
        const int64_t t = row[b];
        if (t < 0)
          throw std::invalid_argument("moe schedule: tokens[" + std::to_string(j) + "][" + std::to_string(e0 + b) +
                                      "] is negative");
        const int64_t r = in.replicas[static_cast<size_t>(e0 + b) * n + j];
        if (r == 0) {  // most ranks host no replica of a given expert
          over[b] += t;
        } else {
          const int64_t cap = r * quota[b] + std::clamp<int64_t>(extra[b] - before[b], 0, r);
          before[b] += r;
          const int64_t keep = std::min(t, cap);
          local[b][j] = keep;
          over[b] += t - keep;
          resid[b] += cap - keep;
        }
        overPrefix[b][j + 1] = over[b];
        residPrefix[b][j + 1] = resid[b];
      }
    }
  }

  // Entry `self` of the intervals laid out by `own` against every interval
  // of `other`: emit(peer, amount) for each overlap, in rank order.
  template <typename Emit>
  static void intersect(const std::vector<int64_t>& own, int self, const std::vector<int64_t>& other, Emit emit) {
    const int64_t start = own[self], end = own[self + 1];
    if (start == end) return;
    // The first peer whose interval ends after `start`.
    auto it = std::upper_bound(other.begin() + 1, other.end(), start);
    for (size_t j = static_cast<size_t>(it - other.begin()) - 1; j + 1 < other.size() && other[j] < end; ++j) {
      int64_t lo = std::max(other[j], start), hi = std::min(other[j + 1], end);
      if (hi > lo) emit(static_cast<int>(j), hi - lo);
    }
  }
};

}  // namespace

RankSchedule computeSchedule(const ScheduleInput& in, int rank) {
  RankSchedule s;
  computeSchedule(in, rank, &s);
  return s;
}

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
  thread_local ExpertSplit split;
  thread_local std::vector<int64_t> totals;
  split.resize(n);
  totals.assign(E, 0);
  for (int j = 0; j < n; ++j) {
    const int64_t* row = in.tokens + static_cast<size_t>(j) * E;
    for (int e = 0; e < E; ++e) totals[e] += row[e];
  }
  for (int e0 = 0; e0 < E; e0 += kBlock) {
    const int nb = std::min(kBlock, E - e0);
    split.compute(in, totals.data(), e0, nb);
    for (int b = 0; b < nb; ++b) {
      const int e = e0 + b;
      const bool hosted = in.replicas[static_cast<size_t>(e) * n + rank] > 0;
      const int64_t keep = hosted ? split.local[b][rank] : 0;
      int64_t* row = &s.send[static_cast<size_t>(e) * n];
      row[rank] = keep;
      s.sendToRank[rank] += keep;
      ExpertSplit::intersect(split.overPrefix[b], rank, split.residPrefix[b], [&](int j, int64_t k) {
        row[j] += k;
        s.sendToRank[j] += k;
      });
      if (!hosted) continue;
      s.localExperts.push_back(e);
      size_t base = s.recv.size();
      s.recv.resize(base + n, 0);
      int64_t* from = &s.recv[base];
      from[rank] = keep;
      s.recvFromRank[rank] += keep;
      ExpertSplit::intersect(split.residPrefix[b], rank, split.overPrefix[b], [&](int j, int64_t k) {
        from[j] += k;
        s.recvFromRank[j] += k;
      });
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
