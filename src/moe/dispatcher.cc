#include "moe/dispatcher.h"

#include <algorithm>
#include <memory>
#include <stdexcept>

#include "coll/reduce.h"
#include "common/copy.h"
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

// FNV-1a over the replica table.
uint64_t tableHash(const int32_t* table, size_t entries) {
  uint64_t h = 1469598103934665603ull;
  const auto* bytes = reinterpret_cast<const uint8_t*>(table);
  for (size_t i = 0; i < entries * sizeof(int32_t); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  return h;
}

// Staging for the exchanges, kept per thread across calls: a training
// step's buffers are the same size every step, and fresh ones cost a
// zero fill and page faults each time (17% of a dispatch + combine in
// dispatch_perf). One for what is sent, one for what is received.
enum ScratchSide { kSendSide = 0, kReceiveSide = 1 };

uint8_t* scratch(ScratchSide side, size_t bytes) {
  struct Buffer {
    std::unique_ptr<uint8_t[]> data;
    size_t bytes = 0;
  };
  thread_local Buffer buffers[2];
  Buffer& b = buffers[side];
  if (b.bytes < bytes) {
    b.data.reset(new uint8_t[bytes]);  // not zeroed: every byte used is written first
    b.bytes = bytes;
  }
  return b.data.get();
}

constexpr size_t kCheckWords = 3;  // table hash, first bad choice, its expert id

// gathered: per rank, its expert counts then the kCheckWords.
void checkGathered(const std::vector<int64_t>& gathered, int n, int nexperts, int k, int me) {
  const size_t stride = static_cast<size_t>(nexperts) + kCheckWords;
  for (int j = 0; j < n; ++j) {
    const int64_t* w = gathered.data() + j * stride + nexperts;
    ECCL_CHECK_ARG(w[1] < 0, "ecclMoeDispatch: rank {}'s token {} choice {} names expert {}, outside [0, {}){}", j,
                   w[1] / k, w[1] % k, w[2], nexperts, j == me ? " (this rank)" : "");
  }
  const int64_t mine = gathered[me * stride + nexperts];
  for (int j = 0; j < n; ++j) {
    const int64_t theirs = gathered[j * stride + nexperts];
    ECCL_CHECK_ARG(theirs == mine,
                   "ecclMoeDispatch: the replica table differs between ranks: rank {}'s hashes to {:016x}, this rank's "
                   "({}) to {:016x}; every rank must pass the same [experts x ranks] table",
                   j, static_cast<uint64_t>(theirs), me, static_cast<uint64_t>(mine));
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
  // Everyone's counts (tokens on rank j for expert e), then the hash of its
  // replica table and its first bad choice: every rank fails together,
  // naming the rank at fault, before any row moves.
  const size_t stride = static_cast<size_t>(nexperts) + kCheckWords;
  std::vector<int64_t> mine(stride, 0), all(static_cast<size_t>(n) * nexperts);
  int64_t badChoice = -1, badExpert = 0;
  for (int64_t i = 0; i < tokens * k; ++i) {
    int32_t e = topk[i];
    if (e < -1 || e >= nexperts) {
      badChoice = i, badExpert = e;
      break;
    }
    if (e >= 0) mine[e]++;
  }
  mine[nexperts] = static_cast<int64_t>(tableHash(replicas, static_cast<size_t>(nexperts) * n));
  mine[nexperts + 1] = badChoice;
  mine[nexperts + 2] = badExpert;
  std::vector<int64_t> gathered(static_cast<size_t>(n) * stride);
  comm.allGather(mine.data(), gathered.data(), stride, ecclInt64);
  checkGathered(gathered, n, nexperts, k, comm.rank());
  for (int j = 0; j < n; ++j)
    std::copy_n(gathered.begin() + static_cast<ptrdiff_t>(j * stride), nexperts,
                all.begin() + static_cast<ptrdiff_t>(j) * nexperts);
  ScheduleInput in{n, nexperts, all.data(), replicas};
  const int rank = comm.rank();
  schedule_ = invalidToEccl("ecclMoeDispatch", [&] { return computeSchedule(in, rank); });
  permute_ = invalidToEccl("ecclMoeDispatch", [&] { return planPermute(topk, tokens, k, schedule_, nexperts); });
  layout_ = planReceive(schedule_);
  uint8_t* sendBuf = scratch(kSendSide, static_cast<size_t>(permute_.sendRows) * rowBytes_);
  permuteRows(x, rowBytes_, tokens, k, permute_, sendBuf);
  grouped_.reset(new uint8_t[std::max<size_t>(1, static_cast<size_t>(layout_.recvRows) * rowBytes_)]);
  exchangeForward(comm, sendBuf, grouped_.get());
}

// The rows a rank keeps (local first) skip the exchange: they move from
// the send buffer straight to their expert-major place, and back.
void DispatchPlan::exchangeForward(Communicator& comm, const uint8_t* sendBuf, void* expertMajor) {
  const int me = comm.rank();
  uint8_t* recvBuf = scratch(kReceiveSide, static_cast<size_t>(layout_.recvRows) * rowBytes_);
  std::vector<size_t> sc, sd, rc, rd;
  toElements(permute_.sendRowsTo, permute_.sendRowOffset, hidden_, &sc, &sd);
  toElements(schedule_.recvFromRank, layout_.recvRowOffset, hidden_, &rc, &rd);
  sc[me] = rc[me] = 0;
  comm.allToAllv(sendBuf, sc.data(), sd.data(), recvBuf, rc.data(), rd.data(), type_);
  auto* out = static_cast<uint8_t*>(expertMajor);
  const int64_t selfFirst = layout_.recvRowOffset[me], selfRows = schedule_.recvFromRank[me];
  for (int64_t r = 0; r < layout_.recvRows; ++r) {
    const bool kept = r >= selfFirst && r < selfFirst + selfRows;
    const uint8_t* from = kept ? sendBuf + (permute_.sendRowOffset[me] + (r - selfFirst)) * rowBytes_
                               : recvBuf + r * rowBytes_;
    copyBytes(out + layout_.regroupTo[r] * rowBytes_, from, rowBytes_);
  }
}

const uint8_t* DispatchPlan::exchangeBackward(Communicator& comm, const void* expertMajor) {
  const int me = comm.rank();
  uint8_t* back = scratch(kSendSide, static_cast<size_t>(layout_.recvRows) * rowBytes_);
  uint8_t* returned = scratch(kReceiveSide, static_cast<size_t>(permute_.sendRows) * rowBytes_);
  const auto* in = static_cast<const uint8_t*>(expertMajor);
  const int64_t selfFirst = layout_.recvRowOffset[me], selfRows = schedule_.recvFromRank[me];
  for (int64_t r = 0; r < layout_.recvRows; ++r) {
    const bool kept = r >= selfFirst && r < selfFirst + selfRows;
    uint8_t* to = kept ? returned + (permute_.sendRowOffset[me] + (r - selfFirst)) * rowBytes_ : back + r * rowBytes_;
    copyBytes(to, in + layout_.regroupTo[r] * rowBytes_, rowBytes_);
  }
  std::vector<size_t> sc, sd, rc, rd;
  toElements(schedule_.recvFromRank, layout_.recvRowOffset, hidden_, &sc, &sd);
  toElements(permute_.sendRowsTo, permute_.sendRowOffset, hidden_, &rc, &rd);
  sc[me] = rc[me] = 0;
  comm.allToAllv(back, sc.data(), sd.data(), returned, rc.data(), rd.data(), type_);
  return returned;
}

void DispatchPlan::checkEpoch(const Communicator& comm, const char* fn) const {
  ECCL_CHECK_ARG(static_cast<int>(comm.epoch()) == epoch_,
                 "{}: the plan was made at epoch {}, the communicator is at epoch {} (another view); dispatch again",
                 fn, epoch_, comm.epoch());
}

void DispatchPlan::checkCombine(const Communicator& comm, const void* expertOutput, const float* weights,
                                const void* out) const {
  checkEpoch(comm, "ecclMoeCombine");
  ECCL_CHECK_ARG(!weights || type_ == ecclFloat32 || type_ == ecclFloat16 || type_ == ecclBfloat16,
                 "ecclMoeCombine: a weighted combine needs float32, float16 or bfloat16 data, the dispatch carried {} "
                 "(weights NULL returns each choice's rows, any type)",
                 coll::typeName(type_));
  ECCL_CHECK_ARG(expertOutput || layout_.recvRows == 0, "ecclMoeCombine: expertOutput is NULL");
  ECCL_CHECK_ARG(out || tokens_ == 0, "ecclMoeCombine: out is NULL");
}

void DispatchPlan::combine(Communicator& comm, const void* expertOutput, const float* weights, void* out) {
  checkCombine(comm, expertOutput, weights, out);
  const uint8_t* returned = exchangeBackward(comm, expertOutput);
  if (weights)
    combineRows(returned, weights, tokens_, k_, hidden_, type_, permute_, out);
  else
    gatherChoiceRows(returned, rowBytes_, tokens_, k_, permute_, out);
}

void DispatchPlan::checkAlong(const Communicator& comm, const void* rows, const void* expertMajor) const {
  checkEpoch(comm, "ecclMoeDispatchAlong");
  ECCL_CHECK_ARG(rows || tokens_ == 0, "ecclMoeDispatchAlong: rows is NULL");
  ECCL_CHECK_ARG(expertMajor || layout_.recvRows == 0, "ecclMoeDispatchAlong: expertRows is NULL");
}

void DispatchPlan::dispatchAlong(Communicator& comm, const void* rows, bool perChoice, void* expertMajor) {
  checkAlong(comm, rows, expertMajor);
  uint8_t* sendBuf = scratch(kSendSide, static_cast<size_t>(permute_.sendRows) * rowBytes_);
  if (perChoice)
    permuteChoiceRows(rows, rowBytes_, tokens_, k_, permute_, sendBuf);
  else
    permuteRows(rows, rowBytes_, tokens_, k_, permute_, sendBuf);
  exchangeForward(comm, sendBuf, expertMajor);
}

}  // namespace eccl::moe
