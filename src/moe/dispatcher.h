// The MoE dispatch on a communicator (host buffers): all-gather the token
// counts, compute the schedule (kernels/moe_schedule.h), permute, exchange
// with an all-to-all-v without padding, regroup expert-major; combine runs
// it all backwards. A plan holds one dispatch's layout for its combine.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/communicator.h"
#include "kernels/moe_permute.h"

namespace eccl::moe {

class DispatchPlan {
 public:
  // Collective over `comm`; replicas[e * nranks + j] must be the same on every rank.
  DispatchPlan(Communicator& comm, const void* x, const int32_t* topk, int64_t tokens, int k, int64_t hidden,
               ecclDataType_t type, const int32_t* replicas, int nexperts) ECCL_REQUIRES(comm.callerRole());
  // The checks that need no data, as the constructor makes them; returns the bytes of one row.
  static size_t checkArguments(const void* x, const int32_t* topk, int64_t tokens, int k, int64_t hidden,
                               ecclDataType_t type, const int32_t* replicas, int nexperts);
  // The checks combine makes before any data moves.
  void checkCombine(const Communicator& comm, const void* expertOutput, const float* weights, const void* out) const
      ECCL_REQUIRES_SHARED(comm.callerRole());
  // Expert outputs in the expert-major layout of expertInput(); collective.
  // weights NULL: out is [tokens][k] rows, each choice's result unweighted
  // (zeros for no choice), for any element type.
  void combine(Communicator& comm, const void* expertOutput, const float* weights, void* out) ECCL_REQUIRES(comm.callerRole());
  // Rows routed along this plan with no new counts (the backward of
  // combine): per token like x, or per choice ([tokens][k] rows); the
  // result lands in expertMajor, laid out like expertInput(). Collective.
  void checkAlong(const Communicator& comm, const void* rows, const void* expertMajor) const ECCL_REQUIRES_SHARED(comm.callerRole());
  void dispatchAlong(Communicator& comm, const void* rows, bool perChoice, void* expertMajor) ECCL_REQUIRES(comm.callerRole());

  void* expertInput() { return grouped_.get(); }
  const std::vector<int32_t>& localExperts() const { return schedule_.localExperts; }
  const std::vector<int64_t>& expertRows() const { return layout_.expertRows; }
  const std::vector<int64_t>& expertOffsets() const { return layout_.expertOffset; }
  int64_t rowsSent() const { return permute_.sendRows; }
  // Rows this rank keeps for its own replicas (in rowsSent and rowsReceived).
  int64_t rowsKept() const { return schedule_.recvFromRank.empty() ? 0 : schedule_.recvFromRank[schedule_.rank]; }
  int64_t rowsReceived() const { return layout_.recvRows; }
  int64_t tokens() const { return tokens_; }
  int epoch() const { return epoch_; }
  int topk() const { return k_; }
  size_t rowBytes() const { return rowBytes_; }

 private:
  void checkEpoch(const Communicator& comm, const char* fn) const ECCL_REQUIRES_SHARED(comm.callerRole());
  // The send buffer (send-buffer order) to the expert-major rows, and back.
  void exchangeForward(Communicator& comm, const uint8_t* sendBuf, void* expertMajor) ECCL_REQUIRES(comm.callerRole());
  // The rows in send-buffer order, in this thread's receive scratch.
  const uint8_t* exchangeBackward(Communicator& comm, const void* expertMajor) ECCL_REQUIRES(comm.callerRole());

  int64_t tokens_, hidden_;
  int k_;
  ecclDataType_t type_;
  size_t rowBytes_;
  int epoch_;
  RankSchedule schedule_;
  PermutePlan permute_;
  ReceiveLayout layout_;
  std::unique_ptr<uint8_t[]> grouped_;  // the received rows, expert-major
};

}  // namespace eccl::moe
