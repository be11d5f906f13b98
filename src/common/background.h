// One thread that runs a communicator's background jobs in order: opening
// the connections of a view being prepared, keeping eager standbys
// connected. Coordinator callbacks must not block, so they post here.
#pragma once

#include <deque>
#include <functional>
#include <thread>

#include "common/mutex.h"

namespace eccl {

class BackgroundWorker {
 public:
  BackgroundWorker();
  // Drops the jobs not started yet and waits for the running one; jobs
  // bound their own waits by deadlines, so this returns in bounded time.
  ~BackgroundWorker();
  BackgroundWorker(const BackgroundWorker&) = delete;
  BackgroundWorker& operator=(const BackgroundWorker&) = delete;

  void post(std::function<void()> job);

 private:
  void run();
  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> jobs_ ECCL_GUARDED_BY(mu_);
  bool stopping_ ECCL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace eccl
