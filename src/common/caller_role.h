// The caller role: the right to use a communicator's per-call state (its
// view, rank, sequence counters, sandbox and recording). NCCL's rule, one
// thread calls into a communicator at a time, is kept here by a hand-off
// rather than a lock: the application's thread holds the role while it
// runs an entry point, the stream proxy's thread while it runs a
// stream-ordered op, and an entry point first waits for the proxy's queue
// to drain (api::Entered). A lock would only hide a broken hand-off; this
// capability has no run-time state, and clang's thread-safety analysis
// checks that every use of that state is reached through a holder.
#pragma once

#include "common/mutex.h"

namespace eccl {

class ECCL_CAPABILITY("caller role") CallerRole {
 public:
  void take() ECCL_ACQUIRE() {}
  void give() ECCL_RELEASE() {}
  // Shared: state only a holder of the whole role changes, read where
  // the proxy may be running (rank, size, epoch: the proxy never changes them).
  void takeShared() ECCL_ACQUIRE_SHARED() {}
  void giveShared() ECCL_RELEASE_SHARED() {}
};

// Holds the role for a scope: the proxy per op, a deferred group call at
// ecclGroupEnd, a constructor before the object is shared.
class ECCL_SCOPED_CAPABILITY CallerTurn {
 public:
  explicit CallerTurn(CallerRole& role) ECCL_ACQUIRE(role) : role_(role) { role_.take(); }
  ~CallerTurn() ECCL_RELEASE() { role_.give(); }
  CallerTurn(const CallerTurn&) = delete;
  CallerTurn& operator=(const CallerTurn&) = delete;

 private:
  CallerRole& role_;
};

class ECCL_SCOPED_CAPABILITY SharedCallerTurn {
 public:
  explicit SharedCallerTurn(CallerRole& role) ECCL_ACQUIRE_SHARED(role) : role_(role) { role_.takeShared(); }
  ~SharedCallerTurn() ECCL_RELEASE() { role_.giveShared(); }
  SharedCallerTurn(const SharedCallerTurn&) = delete;
  SharedCallerTurn& operator=(const SharedCallerTurn&) = delete;

 private:
  CallerRole& role_;
};

}  // namespace eccl
