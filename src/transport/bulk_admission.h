// Bulk admission on one lane: Device::isendBulk's frames wait here, none
// started, and go to the lane's send queue one at a time while the lane has
// room for bulk. Room is the conduit's to say where it sees its peer's reads
// (a ring); elsewhere (TCP) it is counted (BulkCredit). A lane quiet for
// DeviceOptions::bulkQuietAfterMs may fill deeper; a busy one stays shallow
// so a foreground message never waits behind megabytes of snapshot or log
// traffic. One per lane, touched under the device lock.
#pragma once

#include <chrono>
#include <deque>
#include <optional>
#include <utility>

#include "common/clock.h"
#include "transport/bulk_credit.h"
#include "transport/conduit.h"
#include "transport/send_item.h"

namespace eccl::transport::lanes {

class BulkAdmission {
 public:
  void queue(SendItem item) { waiting_.push_back(std::move(item)); }
  void foregroundPosted(Clock::time_point at) { foregroundPostedAt_ = at; }

  bool empty() const { return waiting_.empty(); }
  // The last pass stopped for want of room: the device then sleeps on
  // Conduit::armBulkWakeup, not on the conduit's room for sends.
  bool heldBack() const { return heldBack_; }
  bool wantsRoom() const { return !waiting_.empty() && !heldBack_; }

  // A pass over the lane's sends begins: nothing is held back yet.
  void beginPass() { heldBack_ = false; }
  // The next frame, when the lane has room for it now; nothing (and held
  // back) when it has not.
  std::optional<SendItem> admit(const Conduit& conduit, Clock::time_point now, std::chrono::milliseconds quietAfter) {
    if (waiting_.empty()) return std::nullopt;
    const bool quiet = now - foregroundPostedAt_ >= quietAfter;
    const bool room = conduit.seesPeerReads() ? quiet || conduit.roomForBulk() : credit_.room(quiet);
    if (!room) {
      heldBack_ = true;
      return std::nullopt;
    }
    SendItem next = std::move(waiting_.front());
    waiting_.pop_front();
    return next;
  }

  // The frames not started, for a failure or a cancel to go through.
  std::deque<SendItem>& waiting() { return waiting_; }
  BulkCredit& credit() { return credit_; }

  // The lane closed: nothing waits, and the count starts again from zero.
  void reset() {
    waiting_.clear();
    heldBack_ = false;
    credit_.reset();
  }

 private:
  std::deque<SendItem> waiting_;
  bool heldBack_ = false;
  Clock::time_point foregroundPostedAt_{};
  BulkCredit credit_;
};

}  // namespace eccl::transport::lanes
