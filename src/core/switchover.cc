// The communicator's side of two-phase reconfiguration and grow: the
// checks that need the view, then elastic::Migration decides, and the view
// it decides is applied here.
#include <algorithm>

#include "common/error.h"
#include "common/log.h"
#include "core/communicator.h"

namespace eccl {

void Communicator::prepareMigration(int rank) {
  checkUsable();
  checkRank(rank, "ecclCommPrepare");
  migration_->request(rank);
}

ecclPrepareState_t Communicator::prepareStatus(std::string* why, int* leavingRank) const {
  return migration_->status(why, leavingRank);
}

void Communicator::migrationSend(const void* buf, size_t bytes) { migration_->send(buf, bytes); }

void Communicator::migrationRecv(void* buf, size_t bytes) { migration_->recv(buf, bytes); }

void Communicator::becomeJoiner(const membership::ViewUpdate& v) {
  joining_ = true;
  rank_ = v.rank;
  migration_->setRank(v.rank);
  view_.epoch = v.epoch - 1;
  view_.rankToMember.clear();
  for (const auto& e : v.entries) view_.rankToMember.push_back(e.member);
  // The leaver streams its state in the current epoch.
  device_->setEpoch(v.epoch - 1);
  currentEpoch_ = v.epoch - 1;
}

void Communicator::switchover() {
  if (!leftView_.empty()) fail(ecclInvalidUsage, "ecclCommSwitchover: {}", leftView_);
  // A revoked member still votes (no), so the others' votes end at once.
  std::string revoked;
  if (!joining_) {
    try {
      checkUsable();
    } catch (const Error& e) {
      if (e.code() == ecclEvicted) throw;
      revoked = e.what();
    }
  }
  auto start = Clock::now();
  elastic::Migration::Decision d = migration_->decide(revoked);
  reconfig_.prepared = d.prepared;
  if (d.leaving) return leaveView(d.view, start);
  uint32_t oldEpoch = view_.epoch;
  // Entering the view connects its latency peers; one that died after its
  // vote fails that, and the view stands, revoked, to recover from.
  try {
    enterNextView(d.view, d.leavers);
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("ecclCommSwitchover (rank {}): epoch {} is current, but a member of it is gone: "
                                      "{}; call ecclCommRecover",
                                      rank_, d.view.epoch, e.what()));
  }
  finishReconfiguration(start, d.agreed, oldEpoch, "switched over");
  if (!d.missed.empty())
    fail(ecclRemoteError,
         "ecclCommSwitchover (rank {}): epoch {} is current, but this member's vote missed a member: {}; call "
         "ecclCommRecover",
         rank_, d.view.epoch, d.missed);
}

void Communicator::enterNextView(const membership::ViewUpdate& v, const std::vector<transport::MemberId>& leavers) {
  migration_->reset();
  joining_ = false;
  applyView(v);
  // The joiner knew the leaver only for the state stream.
  transport::DeviceStats beforeClose = device_->stats();
  for (transport::MemberId l : leavers)
    if (l != self_ && std::find(view_.rankToMember.begin(), view_.rankToMember.end(), l) == view_.rankToMember.end())
      device_->removePeer(l);
  transport::DeviceStats afterClose = device_->stats();
  reconfig_.connectionsClosed += afterClose.connectionsClosed - beforeClose.connectionsClosed;
  reconfig_.queuePairsClosed += afterClose.queuePairsClosed - beforeClose.queuePairsClosed;
}

// The others went on without this member and close their links to it;
// those closings are nobody's failure.
void Communicator::leaveView(const membership::ViewUpdate& v, Clock::time_point start) {
  {
    MutexLock lock(reporterMu_);
    reporter_ = nullptr;
  }
  leftView_ = fmt::format("rank {} left the view at epoch {} ({}); destroy this communicator", rank_, v.epoch, v.why);
  {
    MutexLock lock(errorMu_);
    asyncError_ = ecclInvalidUsage;
    asyncMessage_ = leftView_;
  }
  reconfig_.totalMs = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  log::info("{}", leftView_);
}

void Communicator::grow(int count) {
  checkUsable();
  ECCL_CHECK_ARG(count >= 1, "ecclCommGrow: count={} must be at least 1", count);
  auto start = Clock::now();
  client_->requestGrow(view_.epoch, static_cast<uint32_t>(count));
  membership::ViewUpdate v = client_->awaitView(deadlineAfterMs(timeoutMs_), fmt::format("ecclCommGrow (rank {})", rank_));
  auto agreed = Clock::now();
  uint32_t oldEpoch = view_.epoch;
  applyView(v);
  reconfig_.prepared = {};
  finishReconfiguration(start, agreed, oldEpoch, "grew");
}

void Communicator::finishReconfiguration(Clock::time_point start, Clock::time_point agreed, uint32_t oldEpoch,
                                         const char* what) {
  reconfig_.agreeMs = std::chrono::duration<double, std::milli>(agreed - start).count();
  reconfig_.totalMs = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  if (view_.epoch != oldEpoch) reconfigurations_++;
  log::info("rank {} {} into epoch {} with {} ranks in {:.1f} ms ({})", rank_, what, view_.epoch, size(),
            reconfig_.totalMs, lastWhy_);
}

}  // namespace eccl
