// Permute and combine around the MoE all-to-all-v: the CPU reference. The
// CUDA kernels (moe_kernels.cu) implement the same contract and the tests
// compare the two bit for bit.
//
// Permute: token t's k-th choice topk[t*k + s] (-1: none) for expert e is
// assigned, in token order, to the destinations of this rank's schedule row
// send[e][*] in ascending rank order (the first send[e][0] such choices go
// to rank 0, and so on). The send buffer is ordered by destination rank,
// then expert, keeping token order inside each (rank, expert) chunk:
//   row = rankBase[j] + expertBase[j][e] + position within the chunk.
// rowOf[t*k + s] is that row (-1 for no choice); the row holds x[t].
//
// The received buffer of the all-to-all-v is ordered by source rank, then
// expert. regroup makes it expert-major (local experts ascending, then
// source rank, keeping order) so each expert runs on one contiguous block;
// ungroup is its inverse.
//
// Combine: after the experts' outputs come back in send-buffer order,
//   out[t] = sum over s in 0..k-1 with rowOf >= 0 of w[t*k + s] * y[rowOf[t*k + s]]
// accumulated in float32 in slot order (deterministic), rounded once to the
// element type (float32, float16 or bfloat16).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "eccl.h"
#include "kernels/moe_schedule.h"

namespace eccl::moe {

struct PermutePlan {
  std::vector<int64_t> rowOf;         // [T * k]
  std::vector<int64_t> sendRowsTo;    // rows for each destination rank
  std::vector<int64_t> sendRowOffset; // first row of each destination rank
  int64_t sendRows = 0;
};

// Throws std::invalid_argument if topk names an expert out of range or the
// schedule's row sums disagree with the token counts of topk.
PermutePlan planPermute(const int32_t* topk, int64_t tokens, int k, const RankSchedule& schedule, int nexperts);
// Copies rows of x (rowBytes each) into sendBuffer according to the plan.
void permuteRows(const void* x, size_t rowBytes, int64_t tokens, int k, const PermutePlan& plan, void* sendBuffer);

struct ReceiveLayout {
  // For local expert index q (schedule.localExperts[q]): its rows in the
  // expert-major buffer start at expertOffset[q] and number expertRows[q].
  std::vector<int64_t> expertRows, expertOffset;
  // Row r of the received (source-major) buffer lands at regroupTo[r] in
  // the expert-major buffer.
  std::vector<int64_t> regroupTo;
  std::vector<int64_t> recvRowOffset;  // first received row of each source rank
  int64_t recvRows = 0;
};
ReceiveLayout planReceive(const RankSchedule& schedule);
void regroupRows(const void* received, size_t rowBytes, const ReceiveLayout& layout, void* expertMajor);
void ungroupRows(const void* expertMajor, size_t rowBytes, const ReceiveLayout& layout, void* received);

// Per choice, for the backward passes (no weights, any element type):
// permuteChoiceRows sends row i of `rows` ([T * k] rows, choice-major
// within a token) to send-buffer row rowOf[i]; gatherChoiceRows is its
// transpose, out[i] = y[rowOf[i]], zeros for no choice.
void permuteChoiceRows(const void* rows, size_t rowBytes, int64_t tokens, int k, const PermutePlan& plan,
                       void* sendBuffer);
void gatherChoiceRows(const void* y, size_t rowBytes, int64_t tokens, int k, const PermutePlan& plan, void* out);

// y: rows in send-buffer order (what came back); out: [T][hidden].
void combineRows(const void* y, const float* weights, int64_t tokens, int k, int64_t hidden, ecclDataType_t type,
                 const PermutePlan& plan, void* out);

}  // namespace eccl::moe
