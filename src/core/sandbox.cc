// The sandbox of a standby (Communicator::setSandbox): the application's
// training step runs before the standby has a rank, so its first real step
// finds the allocator, the autograd graph and compiled code warm. Every call
// is checked as for a rank, then completes here at once, with a member's
// recorded output where one came for the same call (core/sandbox_feed.h).
#include <cstring>

#include "common/copy.h"
#include "common/error.h"
#include "common/log.h"
#include "core/communicator.h"

namespace eccl {

void Communicator::setSandbox(int nranks, int rank) {
  ECCL_CHECK_ARG(standby_, "ecclCommSandbox: member {:016x} holds rank {}: only a standby can run in the sandbox", self_,
                 rank_);
  if (nranks == 0) {
    endSandbox();
    rank_ = -1;
    return;
  }
  ECCL_CHECK_ARG(nranks > 0 && rank >= 0 && rank < nranks, "ecclCommSandbox: rank {} of {} ranks is not a rank", rank,
                 nranks);
  sandboxRanks_ = nranks;
  rank_ = rank;
  if (feed_) feed_->start(rank);
  log::info("standby {:016x} runs in the sandbox as rank {} of {}{}", self_, rank, nranks,
            feed_ ? ", taking in members' recordings" : "");
}

void Communicator::endSandbox() {
  sandboxRanks_ = 0;
  if (feed_) feed_->stop();
  replaying_.reset();
}

void Communicator::sandboxCall(const transport::CallSignature& s, void* out, size_t outBytes,
                               const std::function<void()>& local) {
  sandboxOps_++;
  local();
  auto preferred = feed_ ? feed_->preferred() : nullptr;
  // Another recording takes over between steps only: a step answered half
  // by one recording and half by another would match neither rank's.
  if (preferred && preferred != replaying_ &&
      (!replaying_ || replayCursor_ == 0 ||
       (preferred->calls[0].signature == s && !(replaying_->calls[replayCursor_].signature == s))))
    replaying_ = preferred, replayCursor_ = 0;
  if (!replaying_) return;
  const sandbox::Recording* recording = replaying_.get();
  // The step replays in order; a call that is not the next recorded one
  // but is the first starts the step again; any other keeps its local answer.
  const auto& calls = recording->calls;
  size_t at = replayCursor_ < calls.size() && calls[replayCursor_].signature == s ? replayCursor_ : 0;
  if (!(calls[at].signature == s)) return;
  replayCursor_ = (at + 1) % calls.size();
  const sandbox::RecordedCall& c = calls[at];
  if (!c.hasOutput || c.bytes != outBytes || recording->nranks != size()) return;
  if (sandbox::Recording::rankDependent(s.kind) && recording->rank != rank_) return;
  copyBytes(out, recording->outputs.data() + c.offset, outBytes);
  sandboxReplayed_++;
}

void Communicator::sandboxCopy(const void* in, void* out, size_t bytes) {
  if (bytes && in != out) moveBytes(out, in, bytes);
}

void Communicator::sandboxZero(void* out, size_t bytes) {
  if (bytes) std::memset(out, 0, bytes);
}

transport::RequestPtr Communicator::sandboxPointToPoint(const transport::CallSignature& s, void* out, size_t bytes) {
  sandboxCall(s, out, out ? bytes : 0, [&]() ECCL_REQUIRES(caller_) { if (out) sandboxZero(out, bytes); });
  auto done = std::make_shared<transport::Request>();
  done->bytes = bytes;
  done->state.store(transport::Request::kDone);
  return done;
}

void Communicator::recordSandboxCalls(int calls) {
  ECCL_CHECK_ARG(!standby_ && rank_ >= 0, "ecclCommSandboxRecord: member {:016x} is a standby: a rank records its calls",
                 self_);
  ECCL_CHECK_ARG(calls >= 0 && static_cast<uint32_t>(calls) <= sandbox::kMaxRecordedCalls,
                 "ecclCommSandboxRecord: {} calls (0 to {})", calls, sandbox::kMaxRecordedCalls);
  recording_.reset();
  if (calls)
    recording_ = std::make_unique<sandbox::RecordingBuilder>(
        rank_, size(), calls, static_cast<size_t>(std::max<int64_t>(0, params::sandboxRecordBytes())));
}

void Communicator::dropSandboxRecording(const char* why) {
  if (!recording_) return;
  log::info("rank {}: sandbox recording dropped: {}", rank_, why);
  recording_.reset();
}

void Communicator::recordForSandbox(const transport::CallSignature& s, const void* out, size_t outBytes) {
  if (!recording_ || recording_->full()) return;
  recording_->add(s, out, outBytes);
  shipSandboxRecordingIfComplete();
}

void Communicator::recordReceivePosted(const transport::CallSignature& s, const transport::RequestPtr& r, void* buf,
                                       size_t bytes) {
  if (recording_ && !recording_->full()) recording_->addPending(s, r.get(), buf, bytes);
}

void Communicator::recordReceiveDone(const transport::RequestPtr& r) {
  if (recording_ && recording_->fill(r.get())) shipSandboxRecordingIfComplete();
}

void Communicator::shipSandboxRecordingIfComplete() {
  if (!recording_->complete()) return;
  auto done = std::make_shared<const sandbox::Recording>(recording_->take());
  recording_.reset();
  worker_->post([this, done] {
    if (eagerStandbys_.empty()) {
      log::info("rank {}: a sandbox recording of {} calls, and no eager standby to ship it to", done->rank,
                done->calls.size());
      return;
    }
    int took = sandbox::shipRecording(*device_, *done, eagerStandbys_, recordingsSent_, timeoutMs_);
    recordingsShipped_ += static_cast<uint64_t>(took);
    log::info("rank {}: a sandbox recording of {} calls ({} bytes) went whole to {} of {} eager standbys", done->rank,
              done->calls.size(), done->outputs.size(), took, eagerStandbys_.size());
  });
}

}  // namespace eccl
