#include <cstdio>
#include <cstdlib>

#include "common/mutex.h"

namespace eccl::lock_order {

const char* name(LockRank rank) {
  switch (rank) {
    case LockRank::kNone: return "an unranked mutex";
    case LockRank::kDevice: return "the device's mutex";
    case LockRank::kCompletionQueue: return "a completion queue's mutex";
    case LockRank::kVerbsContext: return "the verbs context's mutex";
    case LockRank::kReporter: return "the communicator's reporter mutex";
    case LockRank::kCommError: return "the communicator's error mutex";
    case LockRank::kCoordClient: return "the coordinator client's mutex";
  }
  return "?";
}

#ifdef ECCL_LOCK_ORDER_CHECKS
namespace {
// The ranked mutexes this thread holds, in the order it took them.
struct Held {
  LockRank ranks[16];
  int count = 0;
};
thread_local Held held;
}  // namespace

void acquiring(LockRank rank) {
  for (int i = 0; i < held.count; ++i)
    if (held.ranks[i] > rank) {
      std::fprintf(stderr,
                   "eccl: lock order violated: taking %s while holding %s (the order: the device's, a completion "
                   "queue's, the verbs context's, the communicator's reporter and error mutexes, the coordinator "
                   "client's; common/mutex.h)\n",
                   name(rank), name(held.ranks[i]));
      std::abort();
    }
  if (held.count < 16) held.ranks[held.count++] = rank;
}

void released(LockRank rank) {
  for (int i = held.count - 1; i >= 0; --i)
    if (held.ranks[i] == rank) {
      for (int j = i; j + 1 < held.count; ++j) held.ranks[j] = held.ranks[j + 1];
      --held.count;
      return;
    }
}
#else
void acquiring(LockRank) {}
void released(LockRank) {}
#endif

}  // namespace eccl::lock_order
