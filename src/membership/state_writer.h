// Writes the coordinator's durable state through CoordinatorOptions::
// replicate on a thread of its own, so the loop that serves the members
// never waits on etcd. The loop hands over each changed state, numbered;
// only the newest waiting one is written (it covers those before it), and
// the loop carries out a round's actions once the state they announce is
// written. Between writes the hook is asked every 100 ms whether this
// coordinator still leads (a renewal, when one is due).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "common/socket.h"
#include "membership/coordinator.h"

namespace eccl::membership {

class StateWriter {
 public:
  using Replicate = std::function<bool(const CoordinatorState* state)>;
  explicit StateWriter(Replicate replicate);
  ~StateWriter();

  // Readable whenever a write completed or the lead was lost.
  int wakeFd() const { return wake_.get(); }
  void drainWake();

  void write(uint64_t seq, CoordinatorState state);
  uint64_t written() const;  // the highest number known durable
  bool lost() const;         // the hook said this coordinator no longer leads

 private:
  void run();
  void signal();

  Replicate replicate_;
  Fd wake_;
  mutable Mutex mu_;
  CondVar cv_;
  CoordinatorState state_ ECCL_GUARDED_BY(mu_);
  uint64_t wanted_ ECCL_GUARDED_BY(mu_) = 0, written_ ECCL_GUARDED_BY(mu_) = 0;
  bool lost_ ECCL_GUARDED_BY(mu_) = false, stopping_ ECCL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace eccl::membership
