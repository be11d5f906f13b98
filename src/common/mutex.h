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

class ECCL_CAPABILITY("mutex") Mutex {
 public:
  void lock() ECCL_ACQUIRE() { mu_.lock(); }
  void unlock() ECCL_RELEASE() { mu_.unlock(); }
  std::mutex& native() { return mu_; }

 private:
  std::mutex mu_;
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
