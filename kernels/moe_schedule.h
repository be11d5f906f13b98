// The MoE dispatch schedule: which rank's tokens for which expert go to
// which replica, computed identically on every rank from the all-gathered
// token counts and the replica placement, with no further communication.
//
// Contract (the CPU reference here and the CUDA kernel share it):
//   tokens[j * E + e]   tokens on rank j routed to expert e      (N x E)
//   replicas[e * N + j] replicas of expert e hosted by rank j    (E x N)
// For every expert e with S_e tokens and R_e replicas, replica k (ranks in
// ascending order, a rank's replicas consecutively) gets quota
// floor(S_e / R_e) + (k < S_e mod R_e): quotas differ by at most one and
// sum to S_e. A rank's capacity for e is the sum of its replicas' quotas.
//   1. Local first: rank j keeps min(tokens[j][e], capacity[e][j]).
//   2. Overflow: the senders' overflow (ranks ascending) is laid end to end,
//      so are the receivers' residual capacities (ranks ascending); sender i
//      sends to receiver j the length of the intersection of their
//      intervals. Every receiver gets exactly its capacity and each row
//      send[e][*] of rank i sums to tokens[i][e].
// Cost: O(E * N) per rank.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace eccl::moe {

struct ScheduleInput {
  int nranks = 0;
  int nexperts = 0;
  const int64_t* tokens = nullptr;    // [nranks][nexperts]
  const int32_t* replicas = nullptr;  // [nexperts][nranks]
};

struct RankSchedule {
  int rank = -1;
  // send[e * N + j]: this rank's tokens for expert e that go to rank j.
  std::vector<int64_t> send;
  // Experts hosted here (replicas[e][rank] > 0), ascending, and for each
  // recv[k * N + j]: tokens for localExperts[k] arriving from rank j.
  std::vector<int32_t> localExperts;
  std::vector<int64_t> recv;
  // Totals per peer, for the all-to-all-v (tokens, not bytes).
  std::vector<int64_t> sendToRank, recvFromRank;
};

// Throws std::invalid_argument naming the offending entry: negative counts,
// an expert with tokens but no replica, a rank out of range.
RankSchedule computeSchedule(const ScheduleInput& in, int rank);
// The same into an existing schedule, reusing its storage (a training loop
// computes one every step).
void computeSchedule(const ScheduleInput& in, int rank, RankSchedule* out);

// The whole N x N x E answer, for tests: sendAll[(i * E + e) * N + j].
std::vector<int64_t> computeGlobalSchedule(const ScheduleInput& in);

}  // namespace eccl::moe
