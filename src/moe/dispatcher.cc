#include "moe/dispatcher.h"

#include <cstring>
#include <stdexcept>

#include "coll/reduce.h"
#include "common/error.h"

namespace eccl::moe {

namespace {

// Row counts to element counts and displacements for allToAllv.
void toElements(const std::vector<int64_t>& rows, const std::vector<int64_t>& rowOffsets, int64_t hidden,
                std::vector<size_t>* counts, std::vector<size_t>* displs) {
  counts->resize(rows.size());
  displs->resize(rows.size());
  for (size_t j = 0; j < rows.size(); ++j) {
    (*counts)[j] = static_cast<size_t>(rows[j] * hidden);
    (*displs)[j] = static_cast<size_t>(rowOffsets[j] * hidden);
  }
}

template <typename F>
auto invalidToEccl(const char* what, F&& f) {
  try {
    return f();
  } catch (const std::invalid_argument& e) {
    fail(ecclInvalidArgument, "{}: {}", what, e.what());
  }
}

}  // namespace

size_t DispatchPlan::checkArguments(const void* x, const int32_t* topk, int64_t tokens, int k, int64_t hidden,
                                   ecclDataType_t type, const int32_t* replicas, int nexperts) {
  ECCL_CHECK_ARG(tokens >= 0 && k >= 1 && hidden >= 1 && nexperts >= 1,
                 "ecclMoeDispatch: need tokens >= 0, topk >= 1, hidden >= 1, experts >= 1 (got {}, {}, {}, {})", tokens,
                 k, hidden, nexperts);
  ECCL_CHECK_ARG(replicas != nullptr, "ecclMoeDispatch: replicas is NULL");
  ECCL_CHECK_ARG(tokens == 0 || (x && topk), "ecclMoeDispatch: tokens or topk is NULL with {} tokens", tokens);
  return Communicator::checkedBytes(static_cast<size_t>(hidden), type, 1, "ecclMoeDispatch");
}

DispatchPlan::DispatchPlan(Communicator& comm, const void* x, const int32_t* topk, int64_t tokens, int k,
                           int64_t hidden, ecclDataType_t type, const int32_t* replicas, int nexperts)
    : tokens_(tokens), hidden_(hidden), k_(k), type_(type), epoch_(static_cast<int>(comm.epoch())) {
  const int n = comm.size();
  rowBytes_ = checkArguments(x, topk, tokens, k, hidden, type, replicas, nexperts);
  // Everyone's counts: tokens on rank j for expert e.
  std::vector<int64_t> mine(nexperts, 0), all(static_cast<size_t>(n) * nexperts);
  for (int64_t i = 0; i < tokens * k; ++i) {
    int32_t e = topk[i];
    ECCL_CHECK_ARG(e >= -1 && e < nexperts, "ecclMoeDispatch: token {} choice {} names expert {}, outside [0, {})",
                   i / k, i % k, e, nexperts);
    if (e >= 0) mine[e]++;
  }
  comm.allGather(mine.data(), all.data(), static_cast<size_t>(nexperts), ecclInt64);
  ScheduleInput in{n, nexperts, all.data(), replicas};
  schedule_ = invalidToEccl("ecclMoeDispatch", [&] { return computeSchedule(in, comm.rank()); });
  permute_ = invalidToEccl("ecclMoeDispatch", [&] { return planPermute(topk, tokens, k, schedule_, nexperts); });
  layout_ = planReceive(schedule_);
  std::vector<uint8_t> sendBuf(static_cast<size_t>(permute_.sendRows) * rowBytes_);
  permuteRows(x, rowBytes_, tokens, k, permute_, sendBuf.data());
  std::vector<uint8_t> recvBuf(static_cast<size_t>(layout_.recvRows) * rowBytes_);
  std::vector<size_t> sc, sd, rc, rd;
  toElements(permute_.sendRowsTo, permute_.sendRowOffset, hidden, &sc, &sd);
  toElements(schedule_.recvFromRank, layout_.recvRowOffset, hidden, &rc, &rd);
  comm.allToAllv(sendBuf.data(), sc.data(), sd.data(), recvBuf.data(), rc.data(), rd.data(), type);
  grouped_.resize(recvBuf.size());
  regroupRows(recvBuf.data(), rowBytes_, layout_, grouped_.data());
}

void DispatchPlan::checkCombine(const Communicator& comm, const void* expertOutput, const float* weights,
                                const void* out) const {
  ECCL_CHECK_ARG(static_cast<int>(comm.epoch()) == epoch_,
                 "ecclMoeCombine: the plan was made at epoch {}, the communicator is at epoch {}; dispatch again",
                 epoch_, comm.epoch());
  ECCL_CHECK_ARG(type_ == ecclFloat32 || type_ == ecclFloat16 || type_ == ecclBfloat16,
                 "ecclMoeCombine: combine needs float32, float16 or bfloat16 data, the dispatch carried {}",
                 coll::typeName(type_));
  ECCL_CHECK_ARG(expertOutput || layout_.recvRows == 0, "ecclMoeCombine: expertOutput is NULL");
  ECCL_CHECK_ARG((weights && out) || tokens_ == 0, "ecclMoeCombine: weights or out is NULL");
}

void DispatchPlan::combine(Communicator& comm, const void* expertOutput, const float* weights, void* out) {
  checkCombine(comm, expertOutput, weights, out);
  std::vector<uint8_t> back(static_cast<size_t>(layout_.recvRows) * rowBytes_);
  ungroupRows(expertOutput, rowBytes_, layout_, back.data());
  std::vector<uint8_t> returned(static_cast<size_t>(permute_.sendRows) * rowBytes_);
  std::vector<size_t> sc, sd, rc, rd;
  toElements(schedule_.recvFromRank, layout_.recvRowOffset, hidden_, &sc, &sd);
  toElements(permute_.sendRowsTo, permute_.sendRowOffset, hidden_, &rc, &rd);
  comm.allToAllv(back.data(), sc.data(), sd.data(), returned.data(), rc.data(), rd.data(), type_);
  combineRows(returned.data(), weights, tokens_, k_, hidden_, type_, permute_, out);
}

}  // namespace eccl::moe
