// The communicator's boundary-send log calls: checks that need the view,
// then log::SenderLog.
#include "common/error.h"
#include "common/log.h"
#include "core/communicator.h"
#include "transport/frame.h"

namespace eccl {

void Communicator::configureLog(const ecclLogConfig_t& config) { sendLog_.configure(config, size()); }

void Communicator::setLogTag(int64_t iteration, int32_t microbatch) { sendLog_.setTag(iteration, microbatch); }

size_t Communicator::truncateLog(int64_t iteration) { return sendLog_.truncate(iteration); }

size_t Communicator::discardLog(int64_t fromIteration) { return sendLog_.discardFrom(fromIteration); }

void Communicator::fillLogStats(ecclLogStats_t* out) const { sendLog_.fillStats(out); }

void Communicator::readLog(int peer, size_t index, ecclLogRecord_t* record, void* buffer, size_t bufferBytes) const {
  checkRank(peer, "ecclLogRead peer");
  sendLog_.read(peer, index, record, buffer, bufferBytes);
}

void Communicator::replayLog(int peer, int64_t fromIteration, int64_t toIteration) {
  checkUsable();
  checkRank(peer, "ecclLogReplay peer");
  ECCL_CHECK_ARG(peer != rank_, "ecclLogReplay: rank {} cannot replay to itself", peer);
  Deadline deadline = deadlineAfterMs(timeoutMs_);
  size_t sent = sendLog_.replay(
      peer, fromIteration, toIteration,
      [&](const uint8_t* payload, size_t bytes, const uint32_t* crc) ECCL_REQUIRES(caller_) {
        uint64_t seq = transport::FrameHeader::kP2pBit | ++sendSeq_[peer];
        return device_->isend(view_.rankToMember[peer], seq, 0, payload, bytes, crc);
      },
      [&](const transport::RequestPtr& request, const std::string& what) ECCL_REQUIRES(caller_) {
        device_->wait(request, deadline, fmt::format("{} (rank {}, epoch {})", what, rank_, view_.epoch));
      });
  log::info("rank {}: replayed {} record(s) of iterations [{}, {}] to rank {}", rank_, sent, fromIteration,
            toIteration, peer);
}

}  // namespace eccl
