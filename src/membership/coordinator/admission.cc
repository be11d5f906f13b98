// Admission: ranks register until the job forms its first view; standbys
// register at any time; tools ask for the status or a migration and go.
#include <algorithm>

#include "common/log.h"
#include "membership/coordinator/core.h"

namespace eccl::membership {

void CoordinatorCore::answerTool(uint64_t conn, const std::string& peer, const CoordMessage& msg) {
  CoordMessage s;
  s.kind = CoordKind::kStatus;
  s.text = statusText();
  if (msg.kind == CoordKind::kMigrate) {
    std::string refused = startMigration(msg.rank, fmt::format("a tool at {}", peer));
    if (!refused.empty()) s.kind = CoordKind::kError, s.text = refused;
    else s.text = fmt::format("migration of rank {} prepared\n{}", msg.rank, statusText());
  }
  if (msg.kind == CoordKind::kRankExited) {
    std::string refused = vacateRank(msg.rank, msg.text, fmt::format("a tool at {}", peer));
    if (!refused.empty()) s.kind = CoordKind::kError, s.text = refused;
    else s.text = statusText();
  }
  sendTo(conn, s, CoordAction::Kind::kSendAndClose);
}

void CoordinatorCore::join(uint64_t conn, const std::string& peer, const CoordMessage& msg) {
  auto refuse = [&](const std::string& why, uint32_t code = 0) {
    log::warn("coordinator: refused {} from {}: {}", msg.role == Role::kRank ? "a rank" : "a standby", peer, why);
    CoordMessage e;
    e.kind = fenced.count(msg.member) ? CoordKind::kEvicted : CoordKind::kError;
    e.text = why;
    e.policy = code;
    sendTo(conn, e, CoordAction::Kind::kSendAndClose);
  };
  if (fenced.count(msg.member)) return refuse("this member was declared failed and is fenced");
  if (msg.uuid == kJoinResuming) {
    auto known = members.find(msg.member);
    if (known == members.end())
      return refuse("this coordinator does not know the member (it holds no state of its admission)",
                    kErrorMemberUnknown);
    if (!known->second.restored) return refuse("the member is connected already");
    return resume(conn, msg.member, msg.epoch);
  }
  if (members.count(msg.member) || msg.member == 0) return refuse("member id is already in use");
  if (msg.role != Role::kRank && msg.role != Role::kStandby)
    return refuse(fmt::format("unknown role {}", static_cast<uint32_t>(msg.role)));
  if (msg.role == Role::kRank) {
    if (!view.empty()) return refuse("the job has already formed; a late process must join as a standby");
    if (nranks == 0) nranks = msg.nranks;
    if (msg.nranks != nranks)
      return refuse(fmt::format("rank {} says nranks={}, earlier ranks said {}", msg.rank, msg.nranks, nranks));
    if (msg.rank < 0 || msg.rank >= static_cast<int64_t>(nranks))
      return refuse(fmt::format("rank {} is outside [0, {})", msg.rank, nranks));
    for (auto& [mid, r] : rankOf)
      if (r == msg.rank) return refuse(fmt::format("rank {} registered twice", msg.rank));
    rankOf[msg.member] = msg.rank;
  }
  Member m;
  m.id = msg.member;
  m.role = msg.role;
  m.address = msg.address;
  m.pid = msg.pid;
  m.eager = msg.role == Role::kStandby && msg.policy == 1;
  m.joinOrder = joins++;
  m.lastHeard = now;
  m.conn = conn;
  const uint64_t mid = msg.member;
  members[mid] = std::move(m);
  memberOfConn[conn] = mid;
  if (msg.role == Role::kStandby) {
    log::info("coordinator: standby member {:016x} registered at {}{}", mid, msg.address,
              members.at(mid).eager ? " (eager)" : "");
    sendView(mid, "registered as a standby");
    if (members.at(mid).eager) sendStandbys();
    if (replaceHeldUntil) tryRecover();  // a held REPLACE may be complete now
    fillVacantRanks();
  } else if (rankOf.size() == nranks) {
    form();
  }
}

// A rank whose process ended before it registered would hold the others
// in formation until their deadline: an idle standby takes it instead, as
// a replacement does after the job formed. After formation a registered
// rank's death is the usual failure; this is only news before it.
std::string CoordinatorCore::vacateRank(int64_t rank, const std::string& how, const std::string& asker) {
  if (!view.empty()) return "";  // it registered, and its failure is handled as every member's
  if (rank < 0 || (nranks != 0 && rank >= static_cast<int64_t>(nranks)))
    return fmt::format("rank {} is outside [0, {})", rank, nranks);
  for (auto& [mid, r] : rankOf)
    if (r == rank) return "";  // it registered before it ended: its connection's close says so
  log::warn("coordinator: rank {} ended before it registered ({}; told by {}){}", rank, how, asker,
            idleStandbys().empty() ? "; the next standby to register takes it" : "");
  vacantRanks[rank] = how;
  fillVacantRanks();
  return "";
}

void CoordinatorCore::fillVacantRanks() {
  if (!view.empty()) return;
  std::vector<uint64_t> standbys = idleStandbys();
  auto standby = standbys.begin();
  for (auto it = vacantRanks.begin(); it != vacantRanks.end() && standby != standbys.end(); ++standby) {
    Member& m = members.at(*standby);
    m.role = Role::kRank;
    rankOf[*standby] = it->first;
    log::info("coordinator: standby member {:016x} (pid {}) takes rank {}, whose process ended before it "
              "registered ({})", *standby, m.pid, it->first, it->second);
    it = vacantRanks.erase(it);
  }
  if (nranks != 0 && rankOf.size() == nranks) form();
}

// A member of the job the previous coordinator knew came back: it keeps
// its id, role and rank, and hears where the job stands: the view always
// (its client takes one of the epoch it is in as an acknowledgement, not
// news), and the failures of that epoch if it missed nothing else.
void CoordinatorCore::resume(uint64_t conn, uint64_t mid, uint32_t itsEpoch) {
  Member& m = members.at(mid);
  m.restored = false;
  m.conn = conn;
  m.viewHeld = 0;  // whatever it holds, it gets the whole view
  m.unreachable = false;
  m.lastHeard = now;
  memberOfConn[conn] = mid;
  log::info("coordinator: {} reconnected", label(mid));
  // In the migration's next epoch already: it saw every member vote yes
  // (READY went out only once the vote was durable), a yes the last
  // coordinator may not have lived to hear.
  if (pending && pending->voting && itsEpoch == pending->epoch &&
      std::count(pending->next.begin(), pending->next.end(), mid)) {
    pending->votedYes.insert(mid);
    decideVote();
  }
  sendView(mid, "resumed with the job's new coordinator");
  reannouncePending(mid);
  if (view.empty()) return;
  if (inView(mid) && itsEpoch == epoch && !failed.empty()) send(m, failedNotice(lastFailure));
  if (m.role == Role::kStandby) {
    if (m.eager) sendStandbys();  // the members may dial it again
    tryRecover();                 // a REPLACE may have waited for it
  } else if (eagerListSent) {
    sendStandbys();
  }
}

void CoordinatorCore::form() {
  view.assign(nranks, 0);
  for (auto& [mid, m] : members)
    if (m.role == Role::kRank) view[static_cast<size_t>(rankOf.at(mid))] = mid;
  epoch = issued = 1;
  log::info("coordinator: job formed with {} ranks (epoch 1)", nranks);
  for (uint64_t m : view) sendView(m, "formed");
  for (auto& [mid, m] : members)
    if (m.role == Role::kStandby) sendView(mid, "formed");
  sendStandbys();
}

// Members keep connections to eager standbys open, so promoting one opens
// nothing; standbys learn every new view for the same reason.
// An empty list after an empty one is news to nobody (a member starts
// with none): it is not sent, so a view change wakes no member for it.
void CoordinatorCore::sendStandbys() {
  if (view.empty()) return;
  CoordMessage list;
  list.kind = CoordKind::kStandbys;
  list.epoch = epoch;
  for (uint64_t mid : idleStandbys())
    if (members.at(mid).eager) list.entries.push_back({mid, members.at(mid).address});
  if (list.entries.empty() && !eagerListSent) return;
  eagerListSent = !list.entries.empty();
  auto shared = std::make_shared<const CoordMessage>(std::move(list));
  for (uint64_t m : view) {
    auto it = members.find(m);
    if (it != members.end() && !isFailed(m)) send(it->second, shared);
  }
}

void CoordinatorCore::announceViewToStandbys() {
  for (uint64_t mid : idleStandbys()) sendView(mid, "current view");
  sendStandbys();
}

}  // namespace eccl::membership
