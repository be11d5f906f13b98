#include "kernels/moe_schedule.h"

#include <algorithm>
#include <stdexcept>

namespace eccl::moe {

namespace {

void validate(const ScheduleInput& in) {
  if (in.nranks < 1 || in.nexperts < 1 || !in.tokens || !in.replicas)
    throw std::invalid_argument("moe schedule: need nranks >= 1, nexperts >= 1 and both count tables");
}

// One expert's per-rank capacity, local share, overflow and residual.
struct ExpertSplit {
  std::vector<int64_t> local, overflow, residual;
  explicit ExpertSplit(int n) : local(n), overflow(n), residual(n) {}

  void compute(const ScheduleInput& in, int e) {
    const int n = in.nranks, E = in.nexperts;
    int64_t total = 0, replicas = 0;
    for (int j = 0; j < n; ++j) {
      int64_t t = in.tokens[static_cast<size_t>(j) * E + e];
      int32_t r = in.replicas[static_cast<size_t>(e) * n + j];
      if (t < 0) throw std::invalid_argument("moe schedule: tokens[" + std::to_string(j) + "][" + std::to_string(e) + "] is negative");
      if (r < 0) throw std::invalid_argument("moe schedule: replicas[" + std::to_string(e) + "][" + std::to_string(j) + "] is negative");
      total += t;
      replicas += r;
    }
    if (total > 0 && replicas == 0)
      throw std::invalid_argument("moe schedule: expert " + std::to_string(e) + " has " + std::to_string(total) +
                                  " tokens and no replica");
    const int64_t quota = replicas ? total / replicas : 0, extra = replicas ? total % replicas : 0;
    int64_t before = 0;  // replicas on lower ranks
    for (int j = 0; j < n; ++j) {
      int64_t r = in.replicas[static_cast<size_t>(e) * n + j];
      int64_t cap = r * quota + std::clamp<int64_t>(extra - before, 0, r);
      before += r;
      int64_t t = in.tokens[static_cast<size_t>(j) * E + e];
      local[j] = std::min(t, cap);
      overflow[j] = t - local[j];
      residual[j] = cap - local[j];
    }
  }

  // Walks the intervals of `mine` (entry `self` of `own`) against the
  // intervals of `other`, calling emit(peer, amount) for each overlap.
  template <typename Emit>
  static void intersect(const std::vector<int64_t>& own, int self, const std::vector<int64_t>& other, Emit emit) {
    if (own[self] == 0) return;
    int64_t start = 0;
    for (int j = 0; j < self; ++j) start += own[j];
    const int64_t end = start + own[self];
    int64_t pos = 0;
    for (size_t j = 0; j < other.size() && pos < end; ++j) {
      int64_t lo = std::max(pos, start), hi = std::min(pos + other[j], end);
      if (hi > lo) emit(static_cast<int>(j), hi - lo);
      pos += other[j];
    }
  }
};

}  // namespace

RankSchedule computeSchedule(const ScheduleInput& in, int rank) {
  validate(in);
  if (rank < 0 || rank >= in.nranks)
    throw std::invalid_argument("moe schedule: rank " + std::to_string(rank) + " is outside [0, " +
                                std::to_string(in.nranks) + ")");
  const int n = in.nranks, E = in.nexperts;
  RankSchedule s;
  s.rank = rank;
  s.send.assign(static_cast<size_t>(E) * n, 0);
  s.sendToRank.assign(n, 0);
  s.recvFromRank.assign(n, 0);
  ExpertSplit split(n);
  for (int e = 0; e < E; ++e) {
    split.compute(in, e);
    int64_t* row = &s.send[static_cast<size_t>(e) * n];
    row[rank] = split.local[rank];
    ExpertSplit::intersect(split.overflow, rank, split.residual, [&](int j, int64_t k) { row[j] += k; });
    for (int j = 0; j < n; ++j) s.sendToRank[j] += row[j];
    if (in.replicas[static_cast<size_t>(e) * n + rank] > 0) {
      s.localExperts.push_back(e);
      size_t base = s.recv.size();
      s.recv.resize(base + n, 0);
      int64_t* from = &s.recv[base];
      from[rank] = split.local[rank];
      ExpertSplit::intersect(split.residual, rank, split.overflow, [&](int j, int64_t k) { from[j] += k; });
      for (int j = 0; j < n; ++j) s.recvFromRank[j] += from[j];
    }
  }
  return s;
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
