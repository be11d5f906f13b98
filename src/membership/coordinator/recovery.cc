// Recovery: once every survivor asked, failed ranks are replaced by
// standbys (REPLACE, possibly waiting for a launcher to start more) or
// dropped (SHRINK); and growth by registered standbys. commitView is the
// single place a new view becomes current outside the vote.
#include <algorithm>

#include "common/log.h"
#include "membership/coordinator/core.h"

namespace eccl::membership {

void CoordinatorCore::onRecover(uint64_t from, const CoordMessage& msg) {
  if (msg.epoch != epoch)
    return sendError(from, fmt::format("recovery asked at epoch {}, the current epoch is {}", msg.epoch, epoch));
  // A held report may yet fail someone (its accused's connection closing,
  // or its time running out): the ask waits for it.
  if (failed.empty() && heldReports.empty())
    return sendView(from, "nothing to recover: no member of this view has failed");
  Member& m = members.at(from);
  m.ask = Member::Ask::kRecover;
  m.askArg = msg.policy;
  if (failed.empty()) return;
  // A member of the next view asking to recover has given up its vote.
  if (pending && pending->voting && std::count(pending->next.begin(), pending->next.end(), from)) {
    pending->gaveUp.insert(from);
    pending->recovering.insert(from);
    return decideVote();
  }
  tryRecover();
}

void CoordinatorCore::releaseReservations() {
  replaceHeldUntil.reset();
  if (!anyReserved) return;  // every survivor's ask comes here: no walk over every member each time
  for (auto& [mid, m] : members) m.reserved = false;
  anyReserved = false;
}

void CoordinatorCore::refuseAll(const std::vector<uint64_t>& waiting, const std::string& what,
                                const std::string& why, bool quiet) {
  releaseReservations();
  if (quiet) log::info("coordinator: {} refused: {}", what, why);
  else log::warn("coordinator: {} refused: {}", what, why);
  for (uint64_t m : waiting) {
    members.at(m).ask = Member::Ask::kNone;
    sendError(m, why);
  }
}

void CoordinatorCore::commitView(std::vector<uint64_t> next, const std::vector<uint64_t>& promoted,
                                 const std::string& story, const std::vector<uint64_t>& leavers, uint64_t uuid) {
  viewUuid = uuid;
  for (uint64_t m : failed) eraseMember(m);
  for (uint64_t m : promoted) members.at(m).role = Role::kRank;
  for (auto& [mid, mm] : members) mm.ask = Member::Ask::kNone;
  releaseReservations();
  replaceView(std::move(next));
  failed.clear();
  failedNeededFrom.clear();
  epoch = issued = std::max(issued, epoch) + 1;
  log::info("coordinator: epoch {} with {} ranks ({})", epoch, view.size(), story);
  for (uint64_t m : view) sendView(m, story);
  for (uint64_t m : leavers) sendView(m, story);  // rank -1: it has left the view
  announceViewToStandbys();
}

void CoordinatorCore::onGrow(uint64_t from, const CoordMessage& msg) {
  if (msg.epoch != epoch || !failed.empty() || pending) {
    sendError(from, msg.epoch != epoch ? fmt::format("grow asked at epoch {}, the current epoch is {}", msg.epoch, epoch)
                    : pending         ? "grow refused: a migration is being prepared; switch over first"
                                      : "grow refused: a member has failed; recover first");
    return;
  }
  Member& m = members.at(from);
  m.ask = Member::Ask::kGrow;
  m.askArg = msg.nranks;
  auto waiting = everyoneAsked(Member::Ask::kGrow);
  if (!waiting) return;
  uint32_t count = members.at((*waiting)[0]).askArg;
  for (uint64_t w : *waiting)
    if (members.at(w).askArg != count)
      return refuseAll(*waiting, "grow", "the ranks asked to grow by different counts");
  std::vector<uint64_t> standbys = idleStandbys();
  if (count == 0 || standbys.size() < count)
    return refuseAll(*waiting, "grow",
                     fmt::format("grow by {} needs that many registered standbys; {} are idle", count, standbys.size()),
                     /*quiet=*/count > 0);
  standbys.resize(count);
  std::vector<uint64_t> next = view;
  next.insert(next.end(), standbys.begin(), standbys.end());
  commitView(next, standbys, fmt::format("grew from {} to {} ranks", view.size(), next.size()), {});
}

void CoordinatorCore::refuseGrowAsks(const std::string& why) {
  std::vector<uint64_t> asked;
  for (uint64_t v : view)
    if (auto it = members.find(v); it != members.end() && it->second.ask == Member::Ask::kGrow) asked.push_back(v);
  if (!asked.empty()) refuseAll(asked, "grow", fmt::format("grow refused: {}; recover first", why), /*quiet=*/true);
}

void CoordinatorCore::tryRecover() {
  if (failed.empty()) return releaseReservations();
  if (pending && pending->voting) return;  // the vote decides first
  auto waiting = everyoneAsked(Member::Ask::kRecover);
  if (!waiting) return releaseReservations();
  uint32_t policy = members.at((*waiting)[0]).askArg;
  for (uint64_t m : *waiting)
    if (members.at(m).askArg != policy)
      return refuseAll(*waiting, "recovery", "the surviving ranks asked for different recovery policies");
  if (policy > static_cast<uint32_t>(RecoverPolicy::kReplaceOrShrink))
    return refuseAll(*waiting, "recovery", fmt::format("unknown recovery policy {}", policy));
  std::vector<uint64_t> standbys = idleStandbys(true);
  auto p = static_cast<RecoverPolicy>(policy);
  if (p == RecoverPolicy::kReplace && standbys.size() < failed.size()) {
    // Held while a launcher refills its pool: the idle standbys are
    // reserved (so the launcher sees the pool short and starts more) and
    // each registration tries again, until the wait runs out.
    if (opt.replaceWaitMs > 0 && !replaceHeldUntil) {
      replaceHeldUntil = now + std::chrono::milliseconds(opt.replaceWaitMs);
      log::info("coordinator: REPLACE needs {} standby(s), {} registered; holding it up to {} ms for more",
                failed.size(), standbys.size(), opt.replaceWaitMs);
    }
    if (replaceHeldUntil && now < *replaceHeldUntil) {
      for (uint64_t sb : standbys) members.at(sb).reserved = true;
      anyReserved = !standbys.empty();
      return;
    }
    return refuseAll(*waiting, "recovery",
                     fmt::format("REPLACE needs {} standby(s) for the failed rank(s), {} registered{}; "
                                 "use SHRINK or REPLACE_OR_SHRINK",
                                 failed.size(), standbys.size(),
                                 opt.replaceWaitMs > 0 ? fmt::format(" after waiting {} ms", opt.replaceWaitMs)
                                                       : std::string()));
  }
  std::vector<uint64_t> next;
  std::vector<uint64_t> promoted;
  std::string story;
  size_t used = 0;
  for (size_t r = 0; r < view.size(); ++r) {
    if (!isFailed(view[r])) {
      next.push_back(view[r]);
    } else if (p != RecoverPolicy::kShrink && used < standbys.size()) {
      story += fmt::format("{}rank {} -> standby {:016x}", story.empty() ? "" : ", ", r, standbys[used]);
      promoted.push_back(standbys[used]);
      next.push_back(standbys[used++]);
    } else {
      story += fmt::format("{}rank {} dropped", story.empty() ? "" : ", ", r);
    }
  }
  commitView(next, promoted, story, {});
}

}  // namespace eccl::membership
