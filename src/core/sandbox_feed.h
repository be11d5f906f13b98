// The sandbox's two ends of a recording (core/sandbox_recording.h): a member
// ships what it recorded to the eager standbys it keeps connections to; a
// standby's feed thread takes in whatever any member ships while it runs in
// the sandbox, in the background, and hands the newest to its calls.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "core/sandbox_recording.h"
#include "transport/transport.h"

namespace eccl::sandbox {

// The point-to-point sequence number of part `part` (0 announce, 1 table,
// 2 outputs) of the `index`-th recording between two processes.
uint64_t recordingSeq(uint64_t index, uint32_t part);

// Member side: sends `recording` to each of `standbys` (the index-th for
// each is in `shipped`, advanced here) and waits, in the background, at most
// `timeoutMs` for the sends; returns to how many standbys all of it went.
int shipRecording(transport::Device& device, const Recording& recording,
                  const std::vector<transport::MemberId>& standbys,
                  std::map<transport::MemberId, uint64_t>& shipped, int64_t timeoutMs);

// Standby side. It keeps two recordings: the newest from any member, and
// the newest the sandbox's own rank made (which alone answers the
// rank-dependent calls), so ranks that all record do not take turns
// replacing each other's.
class Feed {
 public:
  Feed(transport::Device& device, size_t maxOutputBytes);
  ~Feed();
  Feed(const Feed&) = delete;
  Feed& operator=(const Feed&) = delete;
  // The view's members, from the coordinator's news (any thread).
  void setMembers(const std::vector<transport::MemberId>& members);
  // Runs until stop(): posts a receive for each member's next recording;
  // `rank` is the sandbox's, whose recordings are preferred.
  void start(int rank);
  // Joins the thread and withdraws its receives (their buffers die here).
  void stop();
  // The sandbox rank's newest recording, else the newest of any rank.
  std::shared_ptr<const Recording> preferred() const;
  uint64_t received() const { return received_.load(); }

 private:
  struct Incoming;  // one member's recording on its way
  void run();
  void postAnnounce(transport::MemberId m, Incoming& in);
  // Moves `in` on once its receives completed; false when the member is
  // dropped (it left or failed, or what it sent is refused: logged).
  bool advance(transport::MemberId m, Incoming& in);
  bool takeAnnounce(transport::MemberId m, Incoming& in, std::string* why);
  bool takeRecording(transport::MemberId m, Incoming& in, std::string* why);
  void withdraw(Incoming& in, const char* why);
  transport::Device& device_;
  const size_t maxOutputBytes_;
  mutable Mutex mu_;
  std::vector<transport::MemberId> members_ ECCL_GUARDED_BY(mu_);
  std::shared_ptr<const Recording> latest_ ECCL_GUARDED_BY(mu_);
  std::shared_ptr<const Recording> own_ ECCL_GUARDED_BY(mu_);  // made by rank_
  int rank_ ECCL_GUARDED_BY(mu_) = -1;
  // Each member's next recording, kept across runs (the thread's own while
  // it runs): a run's pending receives are withdrawn at its end, so the
  // next run asks for the recording after them.
  std::map<transport::MemberId, uint64_t> nextIndex_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> received_{0};
  std::thread thread_;
};

}  // namespace eccl::sandbox
