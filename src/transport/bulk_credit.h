// Bulk admission by count on a lane whose back end cannot see its peer's
// reads (TCP): the sender keeps the bulk bytes the peer has not reported
// reading under a cap, so a foreground message never queues behind
// megabytes of snapshot or log traffic in the kernel's buffers; the
// receiver reports what it read every kReportBytes. One per lane, touched
// under the device lock; a lane that closes starts again from zero.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>

namespace eccl::transport::lanes {

class BulkCredit {
 public:
  static constexpr uint64_t kUnreadBytes = 128 << 10;
  static constexpr uint64_t kQuietUnreadBytes = 1 << 20;  // on a quiet lane (DeviceOptions::bulkQuietAfterMs)
  static constexpr uint64_t kReportBytes = 64 << 10;

  // Sender: a credited frame's payload went out whole.
  void sent(uint64_t bytes) { sent_ += bytes; }
  // Whether another bulk frame may start: what the peer has not reported
  // reading is under the cap (a quiet lane's is larger).
  bool room(bool quiet) const { return sent_ - readByPeer_ < (quiet ? kQuietUnreadBytes : kUnreadBytes); }
  // The peer's report of the bytes it read in all; false (nothing taken)
  // when it claims more than was sent.
  bool peerRead(uint64_t total) {
    if (total > sent_) return false;
    readByPeer_ = std::max(readByPeer_, total);
    return true;
  }
  uint64_t sentTotal() const { return sent_; }

  // Receiver: a credited frame's payload was read (kept or dropped); the
  // total to report once kReportBytes more were read since the last one.
  std::optional<uint64_t> read(uint64_t bytes) {
    read_ += bytes;
    if (read_ - reported_ < kReportBytes) return std::nullopt;
    reported_ = read_;
    return read_;
  }

  void reset() { *this = BulkCredit{}; }

 private:
  uint64_t sent_ = 0, readByPeer_ = 0;  // sending
  uint64_t read_ = 0, reported_ = 0;    // receiving
};

}  // namespace eccl::transport::lanes
