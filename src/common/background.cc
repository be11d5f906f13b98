#include "common/background.h"

#include "common/crypto.h"
#include "common/log.h"

namespace eccl {

BackgroundWorker::BackgroundWorker() : thread_([this] { run(); }) {}

BackgroundWorker::~BackgroundWorker() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    jobs_.clear();
  }
  cv_.notifyAll();
  thread_.join();
}

void BackgroundWorker::post(std::function<void()> job) {
  {
    MutexLock lock(mu_);
    if (stopping_) return;
    jobs_.push_back(std::move(job));
  }
  cv_.notifyAll();
}

void BackgroundWorker::run() {
  for (;;) {
    std::function<void()> job;
    {
      MutexLock lock(mu_);
      while (jobs_.empty() && !stopping_) cv_.wait(mu_);
      if (stopping_) break;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    try {
      job();
    } catch (const std::exception& e) {
      log::warn("background job failed: {}", e.what());
    }
  }
  releaseThreadCryptoState();
}

}  // namespace eccl
