// Work objects and the driver thread. eccl's C calls block, so every call
// a process group makes runs on its own driver thread, in issue order (the
// order torch requires: every rank issues collectives in the same order).
// A send never waits for its receive (eccl stages unexpected messages), so
// isend/irecv pairs in any consistent order cannot deadlock on that thread.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace torch_eccl {

class EcclWork : public c10d::Work {
 public:
  EcclWork(int rank, c10d::OpType type, std::string label, std::vector<at::Tensor> outputs,
           std::optional<std::vector<at::Tensor>> inputs);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  // Blocks until the op is done (raising its error), or until `timeout`
  // (raising; the op itself goes on to its own deadline).
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override {}
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  const std::string& label() const { return label_; }
  // A receive's sender (work._source_rank()); a receive from any source
  // knows it once a message came.
  int sourceRank() const override;
  void setSourceRank(int rank) { sourceRank_.store(rank); }

  // Driver thread only.
  void succeed();
  void failWith(std::exception_ptr error);

 private:
  const std::string label_;
  std::atomic<int> sourceRank_{-1};
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// What a task leaves behind when it posted something non-blocking (a send
// or receive): polled by the driver between tasks until it returns true
// (its work completes) or throws (its work fails). Later tasks run
// meanwhile, so a pending receive never blocks the collectives issued after it.
using Poller = std::function<bool()>;

class Driver {
 public:
  Driver();
  ~Driver();  // runs what is queued and waits for what is pending, then stops
  // Queues `run` for the driver thread; its work completes when it returns
  // (or fails with what it throws). Once stopped, queued work fails with
  // `why` instead of running.
  void post(c10::intrusive_ptr<EcclWork> work, std::function<void()> run);
  // As post, for a task that may leave a poller behind.
  void postPolled(c10::intrusive_ptr<EcclWork> work, std::function<Poller()> run);
  // A synchronous op (the caller waits for it at once) runs on the calling
  // thread when nothing is queued, running or pending: two thread hand-offs
  // fewer per op. Returns false (and runs nothing) otherwise.
  bool runInlineIfIdle(const c10::intrusive_ptr<EcclWork>& work, const std::function<void()>& run);
  // Fails everything queued and everything posted later with `why`.
  void stop(const std::string& why);
  // Blocks until everything queued before this call has run.
  void drain();

 private:
  struct Task {
    c10::intrusive_ptr<EcclWork> work;
    std::function<Poller()> run;
  };
  struct Pending {
    c10::intrusive_ptr<EcclWork> work;
    Poller poll;
  };
  void loop();
  bool pollPending();  // driver thread; true if something completed

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  std::vector<Pending> pending_;  // driver thread only
  size_t pendingCount_ = 0;       // under mu_, for drain()
  bool running_ = false;
  bool exit_ = false;
  std::string stopped_;
  std::thread thread_;
};

}  // namespace torch_eccl
