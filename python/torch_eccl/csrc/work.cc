#include "work.h"

#include <ATen/core/jit_type.h>
#include <c10/util/Exception.h>

namespace torch_eccl {

EcclWork::EcclWork(int rank, c10d::OpType type, std::string label, std::vector<at::Tensor> outputs,
                   std::optional<std::vector<at::Tensor>> inputs)
    : c10d::Work(rank, type, nullptr, inputs),
      label_(std::move(label)),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

bool EcclWork::isCompleted() { return future_->completed(); }

bool EcclWork::isSuccess() const { return future_->completed() && !future_->hasError(); }

std::exception_ptr EcclWork::exception() const {
  return future_->completed() && future_->hasError() ? future_->exception_ptr() : nullptr;
}

std::vector<at::Tensor> EcclWork::result() { return outputs_; }

int EcclWork::sourceRank() const {
  int rank = sourceRank_.load();
  TORCH_CHECK(rank >= 0, "eccl ", label_, ": no source rank (only a receive has one, once its message came)");
  return rank;
}

bool EcclWork::wait(std::chrono::milliseconds timeout) {
  if (timeout == kNoTimeout) {
    future_->wait();
  } else {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, timeout, [&] { return completed_; }))
      TORCH_CHECK_WITH(DistBackendError, false, "eccl ", label_, ": not completed within ", timeout.count(),
                       " ms (the wait's timeout; the operation goes on to the process group's deadline)");
  }
  if (future_->hasError()) std::rethrow_exception(future_->exception_ptr());
  return true;
}

void EcclWork::succeed() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completed_ = true;
  }
  cv_.notify_all();
  future_->markCompleted(c10::IValue(outputs_));
}

void EcclWork::failWith(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completed_ = true;
    exception_ = error;
  }
  cv_.notify_all();
  future_->setError(error);
}

Driver::Driver() : thread_([this] { loop(); }) {}

Driver::~Driver() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    exit_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Driver::post(c10::intrusive_ptr<EcclWork> work, std::function<void()> run) {
  postPolled(std::move(work), [run = std::move(run)]() -> Poller {
    run();
    return {};
  });
}

void Driver::postPolled(c10::intrusive_ptr<EcclWork> work, std::function<Poller()> run) {
  std::string stopped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_.empty()) {
      queue_.push_back({std::move(work), std::move(run)});
      cv_.notify_all();
      return;
    }
    stopped = stopped_;
  }
  work->failWith(std::make_exception_ptr(c10::DistBackendError({__func__, __FILE__, __LINE__},
                                                               "eccl " + work->label() + ": " + stopped)));
}

bool Driver::runInlineIfIdle(const c10::intrusive_ptr<EcclWork>& work, const std::function<void()>& run) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopped_.empty() || !queue_.empty() || running_ || pendingCount_ != 0) return false;
    running_ = true;  // the driver thread takes no task meanwhile
  }
  try {
    run();
    work->succeed();
  } catch (...) {
    work->failWith(std::current_exception());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = false;
  }
  cv_.notify_all();
  return true;
}

void Driver::stop(const std::string& why) {
  std::deque<Task> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_.empty()) stopped_ = why;
    dropped.swap(queue_);
  }
  for (auto& t : dropped)
    t.work->failWith(std::make_exception_ptr(
        c10::DistBackendError({__func__, __FILE__, __LINE__}, "eccl " + t.work->label() + ": " + why)));
  cv_.notify_all();
}

void Driver::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty() && !running_ && pendingCount_ == 0; });
}

bool Driver::pollPending() {
  bool any = false;
  for (size_t i = 0; i < pending_.size();) {
    bool done = false;
    std::exception_ptr error;
    try {
      done = pending_[i].poll();
    } catch (...) {
      error = std::current_exception();
    }
    if (!done && !error) {
      ++i;
      continue;
    }
    if (error) pending_[i].work->failWith(error);
    else pending_[i].work->succeed();
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    any = true;
  }
  if (any) {
    std::lock_guard<std::mutex> lock(mu_);
    pendingCount_ = pending_.size();
    cv_.notify_all();
  }
  return any;
}

void Driver::loop() {
  // While sends or receives are pending, the thread polls them between
  // tasks; the interval grows from 20 us to 1 ms while nothing completes.
  auto interval = std::chrono::microseconds(20);
  for (;;) {
    if (pollPending()) interval = std::chrono::microseconds(20);
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // running_ set by someone else: a caller runs an op inline; wait.
      auto ready = [&] { return (!queue_.empty() && !running_) || (exit_ && pending_.empty() && !running_); };
      if (pending_.empty()) {
        cv_.wait(lock, ready);
      } else if (!cv_.wait_for(lock, interval, ready)) {
        interval = std::min(interval * 2, std::chrono::microseconds(1000));
        continue;
      }
      if (queue_.empty()) return;  // exiting, nothing queued, pending or running
      task = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    try {
      Poller poll = task.run();
      if (poll) pending_.push_back({task.work, std::move(poll)});
      else task.work->succeed();
    } catch (...) {
      task.work->failWith(std::current_exception());
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_ = false;
      pendingCount_ = pending_.size();
    }
    cv_.notify_all();
  }
}

}  // namespace torch_eccl
