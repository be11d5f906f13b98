// The sandbox of a standby (Communicator::setSandbox): the application's
// training step runs before the standby has a rank, so its first real step
// finds the allocator, the autograd graph and compiled code warm. Every call
// is checked as for a rank, then completes here at once.
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "core/communicator.h"

namespace eccl {

void Communicator::setSandbox(int nranks, int rank) {
  ECCL_CHECK_ARG(standby_, "ecclCommSandbox: member {:016x} holds rank {}: only a standby can run in the sandbox", self_,
                 rank_);
  if (nranks == 0) {
    sandboxRanks_ = 0;
    rank_ = -1;
    return;
  }
  ECCL_CHECK_ARG(nranks > 0 && rank >= 0 && rank < nranks, "ecclCommSandbox: rank {} of {} ranks is not a rank", rank,
                 nranks);
  sandboxRanks_ = nranks;
  rank_ = rank;
  log::info("standby {:016x} runs in the sandbox as rank {} of {}", self_, rank, nranks);
}

void Communicator::sandboxCopy(const void* in, void* out, size_t bytes) {
  sandboxOps_++;
  if (bytes && in != out) std::memmove(out, in, bytes);
}

void Communicator::sandboxZero(void* out, size_t bytes) {
  if (bytes) std::memset(out, 0, bytes);
}

transport::RequestPtr Communicator::sandboxDone(void* zeroFill, size_t bytes) {
  sandboxOps_++;
  sandboxZero(zeroFill, bytes);
  auto done = std::make_shared<transport::Request>();
  done->bytes = bytes;
  done->state.store(transport::Request::kDone);
  return done;
}

}  // namespace eccl
