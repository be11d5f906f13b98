// Many coordinator members in one process, for perf/coord_scale: each
// joins over its own authenticated connection and speaks the real protocol
// (sealed messages, heartbeats both ways, views whole or as deltas through
// the same takeView the member client uses, recovery asks, goodbyes), but
// a few event loops serve them all. A thread per member (eccl's
// CoordClient) made the simulation the cost being measured: at 4,096
// members each notice woke a thread, and the wake-ups took the cores the
// coordinator needed to send them.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "membership/unique_id.h"
#include "membership/coord_messages.h"

namespace eccl::perf {

class SimulatedMembers {
 public:
  struct Options {
    int loops = 2;
    int64_t heartbeatMs = 500;
    int64_t heartbeatTimeoutMs = 3000;
  };
  // What one member saw, read by the caller between phases.
  struct Seen {
    uint64_t id = 0;
    std::atomic<uint32_t> epoch{0};           // of the view it holds
    std::atomic<uint64_t> memberAtWatched{0};  // that view's member at watchedRank
    std::atomic<int64_t> viewAtNs{0};          // when it took that view
    std::atomic<int64_t> toldAtNs{0};          // its first failure notice (steady clock)
  };

  SimulatedMembers(const membership::UniqueIdData& job, Options options);
  ~SimulatedMembers();  // members still there close without a goodbye

  // Blocking handshake and join (call from any thread); the member is then
  // served by a loop. Returns its index.
  size_t join(membership::Role role, int rank, int nranks, uint64_t memberId, Deadline deadline);
  Seen& seen(size_t member);
  void setWatchedRank(int rank) { watchedRank_ = rank; }

  // Waits until `count` members hold a view of at least `epoch` in which
  // they have a rank.
  bool awaitViews(size_t count, uint32_t epoch, Deadline deadline);
  // Waits until `count` members were told of a failure.
  bool awaitTold(size_t count, Deadline deadline);
  // The member's connection closes (its process "died"), without a goodbye.
  void kill(size_t member);
  // Every member told of a failure asks for `policy` at `epoch`.
  void askRecover(uint32_t epoch, uint32_t policy);
  // Every member says goodbye and closes.
  void leaveAll(Deadline deadline);
  // The first protocol error any member met ("" when none).
  std::string firstError() const;

 private:
  struct Member;
  struct Loop;
  void serve(Loop& loop);
  void handle(Member& m);
  void note(const std::string& error);
  void countView(uint32_t epoch);
  void countTold();

  membership::UniqueIdData job_;
  Options opt_;
  std::atomic<int> watchedRank_{-1};
  std::mutex membersMu_;
  std::vector<std::unique_ptr<Member>> members_;  // grows under membersMu_; entries never move
  std::vector<std::unique_ptr<Loop>> loops_;
  std::atomic<size_t> nextLoop_{0};
  mutable std::mutex countMu_;
  std::condition_variable countCv_;
  std::vector<size_t> viewsAtEpoch_;  // members that reached each epoch (index: epoch)
  size_t told_ = 0;
  std::string error_;
  std::atomic<bool> stopping_{false};
};

}  // namespace eccl::perf
