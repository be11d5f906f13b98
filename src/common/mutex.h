// An annotated mutex so clang's -Wthread-safety can check GUARDED_BY
// (the LevelDB port/thread_annotations.h habit).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define ECCL_TSA(x) __attribute__((x))
#else
#define ECCL_TSA(x)
#endif

#define ECCL_CAPABILITY(x) ECCL_TSA(capability(x))
#define ECCL_SCOPED_CAPABILITY ECCL_TSA(scoped_lockable)
#define ECCL_GUARDED_BY(x) ECCL_TSA(guarded_by(x))
#define ECCL_PT_GUARDED_BY(x) ECCL_TSA(pt_guarded_by(x))
#define ECCL_REQUIRES(...) ECCL_TSA(requires_capability(__VA_ARGS__))
#define ECCL_EXCLUDES(...) ECCL_TSA(locks_excluded(__VA_ARGS__))
#define ECCL_ACQUIRE(...) ECCL_TSA(acquire_capability(__VA_ARGS__))
#define ECCL_RELEASE(...) ECCL_TSA(release_capability(__VA_ARGS__))
#define ECCL_REQUIRES_SHARED(...) ECCL_TSA(requires_shared_capability(__VA_ARGS__))
#define ECCL_ACQUIRE_SHARED(...) ECCL_TSA(acquire_shared_capability(__VA_ARGS__))
#define ECCL_RELEASE_SHARED(...) ECCL_TSA(release_shared_capability(__VA_ARGS__))
#define ECCL_RETURN_CAPABILITY(x) ECCL_TSA(lock_returned(x))
#define ECCL_ASSERT_CAPABILITY(x) ECCL_TSA(assert_capability(x))

namespace eccl {

// The lock order, outermost first: a thread that holds a ranked mutex
// takes only mutexes of a higher rank. The device calls up into the
// communicator (peer failures) with its lock held, and the communicator
// reports to the coordinator client under its reporter lock; nothing goes
// the other way. clang checks ACQUIRED_AFTER only within one function,
// and a layer cannot name another's mutex (the device's is private to the
// transport), so the order is checked at run time instead, in the
// sanitizer builds, where every suite runs (common/lock_order.cc): a
// mutex taken out of order aborts naming both. Mutexes that nest with
// none of these stay unranked.
enum class LockRank : uint8_t {
  kNone = 0,
  kDevice = 10,           // transport::LaneDevice::mu_
  kCompletionQueue = 20,  // transport::ibverbs::SharedCompletions::mu_
  kVerbsContext = 30,     // transport::ibverbs::Context::asyncMu_
  kReporter = 40,         // Communicator::reporterMu_
  kCommError = 50,        // Communicator::errorMu_
  kCoordClient = 60,      // membership::CoordClient::mu_
};

namespace lock_order {
// No-ops unless the build checks the order (ECCL_LOCK_ORDER_CHECKS).
void acquiring(LockRank rank);
void released(LockRank rank);
const char* name(LockRank rank);
}  // namespace lock_order

class ECCL_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  explicit Mutex(LockRank rank) : rank_(rank) {}
  void lock() ECCL_ACQUIRE() {
    if (rank_ != LockRank::kNone) lock_order::acquiring(rank_);
    mu_.lock();
  }
  void unlock() ECCL_RELEASE() {
    mu_.unlock();
    if (rank_ != LockRank::kNone) lock_order::released(rank_);
  }
  std::mutex& native() { return mu_; }

 private:
  std::mutex mu_;
  const LockRank rank_ = LockRank::kNone;
};

class ECCL_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ECCL_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() ECCL_RELEASE() { mu_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

// Waits with the mutex held by the caller (a MutexLock in scope).
class CondVar {
 public:
  void wait(Mutex& mu) ECCL_REQUIRES(mu) {
    std::unique_lock<std::mutex> lk(mu.native(), std::adopt_lock);
    cv_.wait(lk);
    lk.release();
  }
  // Returns false on timeout.
  template <typename TimePoint>
  bool waitUntil(Mutex& mu, TimePoint deadline) ECCL_REQUIRES(mu) {
    std::unique_lock<std::mutex> lk(mu.native(), std::adopt_lock);
    bool woke = cv_.wait_until(lk, deadline) == std::cv_status::no_timeout;
    lk.release();
    return woke;
  }
  void notifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace eccl
