// The communicator's views beyond the first: a standby's wait for one, a
// membership named outright (c10d's reconfigure: the view becomes a given
// list of members, as a delta), and revocation from another thread.
#include <algorithm>
#include <set>

#include "common/error.h"
#include "common/log.h"
#include "core/communicator.h"

namespace eccl {

void Communicator::awaitPromotion(Deadline until) {
  ECCL_CHECK_ARG(standby_, "member {:016x} is not a standby: it holds rank {}", self_, rank_);
  for (;;) {
    membership::ViewUpdate v = client_->awaitView(until, "standby waiting for promotion");
    if (v.joining || v.rank >= 0) endSandbox();  // the real view replaces the sandbox's
    if (v.joining) {
      becomeJoiner(v);
      standby_ = false;
      joinedEpoch_ = v.epoch;
      log::info("standby chosen to take rank {} at epoch {} ({})", rank_, v.epoch, v.why);
      return;
    }
    if (v.rank >= 0) {
      standby_ = false;
      enterViewAtInit(v);
      break;
    }
    // (An eager standby connects to the view's members from the client's
    // callback, as each view is announced.)
  }
  joinedEpoch_ = view_.epoch;
  log::info("standby promoted to rank {} of {} at epoch {} ({})", rank_, size(), view_.epoch, lastWhy_);
}

// Every member named asks with the same list and uuid; the coordinator
// then makes that list the view. Members kept keep their connections to
// each other (applyView's delta); standbys named become ranks; members of
// the old view left out leave it.
void Communicator::reconfigure(const std::vector<transport::MemberId>& members, uint64_t uuid, int64_t timeoutMs) {
  std::set<transport::MemberId> distinct(members.begin(), members.end());
  ECCL_CHECK_ARG(!members.empty() && distinct.size() == members.size(),
                 "ecclCommReconfigure: the membership is empty or names a member twice ({} members, {} distinct)",
                 members.size(), distinct.size());
  ECCL_CHECK_ARG(distinct.count(self_), "ecclCommReconfigure: this member ({:016x}) is not in the membership it names",
                 self_);
  ECCL_CHECK_ARG(!joining_, "ecclCommReconfigure: rank {} is joining a migration; switch over first", rank_);
  if (!leftView_.empty()) fail(ecclInvalidUsage, "ecclCommReconfigure: {}", leftView_);
  {
    MutexLock lock(errorMu_);
    if (asyncError_ == ecclEvicted) throw Error(ecclEvicted, asyncMessage_);
  }
  if (!standby_) migration_->abstain();  // a migration this member will not finish must not keep the others voting
  auto start = Clock::now();
  uint32_t oldEpoch = standby_ ? 0 : view_.epoch;
  client_->requestReconfigure(oldEpoch, uuid, members);
  Deadline deadline = deadlineAfterMs(timeoutMs > 0 ? timeoutMs : timeoutMs_);
  std::string what = fmt::format("ecclCommReconfigure (uuid {:016x}, member {:016x})", uuid, self_);
  membership::ViewUpdate v;
  for (;;) {
    v = client_->awaitView(deadline, what);
    if (v.uuid == uuid && v.rank >= 0) break;
    if (v.rank < 0 && !standby_) {
      returnToStandby(v);
      client_->requestReconfigure(0, uuid, members);  // the coordinator waits for this ask, as a standby's
    }
    // A standby hears of every other view change; a member may be handed
    // a view another cause made first (it is current: take it, keep waiting).
    if (v.rank >= 0 && !standby_) applyView(v);
  }
  auto agreed = Clock::now();
  migration_->reset();  // a migration being prepared was superseded
  bool wasStandby = standby_;
  standby_ = false;
  endSandbox();
  if (wasStandby) {
    MutexLock lock(reporterMu_);
    reporter_ = client_.get();  // a member again: its peers' failures are news
  }
  applyView(v);  // a member named that died meanwhile: the view stands, revoked
  if (wasStandby) joinedEpoch_ = v.epoch;
  reconfig_.prepared = {};
  finishReconfiguration(start, agreed, oldEpoch, "reconfigured");
}

void Communicator::returnToStandby(const membership::ViewUpdate& v) {
  {
    MutexLock lock(reporterMu_);
    reporter_ = nullptr;  // the members close their links to this one; nobody failed
  }
  for (transport::MemberId m : view_.rankToMember)
    if (m != self_) device_->removePeer(m);
  view_.rankToMember.clear();
  rank_ = -1;
  standby_ = true;
  {
    MutexLock lock(errorMu_);
    if (asyncError_ != ecclEvicted) asyncError_ = ecclSuccess, asyncMessage_.clear();
  }
  log::info("member {:016x} was left out at epoch {} ({}): a standby again", self_, v.epoch, v.why);
}

void Communicator::revoke(const std::string& why) {
  {
    MutexLock lock(errorMu_);
    if (asyncError_ == ecclSuccess || asyncError_ == ecclRemoteError || asyncError_ == ecclTimeout) {
      asyncError_ = ecclRemoteError;
      asyncMessage_ = fmt::format("communicator revoked by this process: {}", why);
    }
  }
  client_->interrupt(why);
  device_->abort(fmt::format("revoked by this process: {}", why));
}

}  // namespace eccl
