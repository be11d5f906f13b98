#include "membership/state_writer.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/clock.h"
#include "common/crypto.h"
#include "common/error.h"
#include "common/log.h"

namespace eccl::membership {

StateWriter::StateWriter(Replicate replicate) : replicate_(std::move(replicate)) {
  wake_ = Fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake_) fail(ecclSystemError, "coordinator: eventfd: {}", strerror(errno));
  thread_ = std::thread([this] {
    run();
    releaseThreadCryptoState();
  });
}

StateWriter::~StateWriter() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.notifyAll();
  thread_.join();
}

void StateWriter::write(uint64_t seq, CoordinatorState state) {
  {
    MutexLock lock(mu_);
    wanted_ = seq;
    state_ = std::move(state);
  }
  cv_.notifyAll();
}

uint64_t StateWriter::written() const {
  MutexLock lock(mu_);
  return written_;
}

bool StateWriter::lost() const {
  MutexLock lock(mu_);
  return lost_;
}

void StateWriter::signal() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof(one));
}

void StateWriter::drainWake() {
  uint64_t count;
  [[maybe_unused]] ssize_t n = ::read(wake_.get(), &count, sizeof(count));
}

void StateWriter::run() {
  MutexLock lock(mu_);
  while (!stopping_) {
    const bool due = wanted_ > written_;
    const uint64_t seq = wanted_;
    CoordinatorState state = due ? std::move(state_) : CoordinatorState();  // only the newest is ever written
    mu_.unlock();
    bool leads = false;
    try {
      leads = replicate_(due ? &state : nullptr);
    } catch (const std::exception& e) {
      log::warn("coordinator: replicating its state failed: {}", e.what());
    }
    mu_.lock();
    if (!leads) {
      lost_ = true;
      signal();
      return;
    }
    if (due) {
      written_ = seq;
      signal();
    }
    if (wanted_ == written_ && !stopping_) cv_.waitUntil(mu_, Clock::now() + std::chrono::milliseconds(100));
  }
}

}  // namespace eccl::membership
