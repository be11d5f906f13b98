// Liveness: heartbeats both ways, members declared failed (silence, a
// closed connection, a peer's report) and fenced, orderly departures, and
// the groups the coordinator only watches.
#include <algorithm>

#include "common/log.h"
#include "membership/coordinator/core.h"

namespace eccl::membership {

void CoordinatorCore::dispatch(uint64_t from, const CoordMessage& msg) {
  auto it = members.find(from);
  if (it == members.end()) return;
  it->second.lastHeard = now;
  switch (msg.kind) {
    case CoordKind::kHeartbeat:
      return;
    case CoordKind::kReport:
      if (!inView(from) && !isJoiner(from)) return;  // a leaver's view of a world it left
      // Nor is a leaver's once the vote is on: members that switched over
      // close their lanes to it, which it may take for their failure.
      if (pending && pending->voting && std::count(pending->leavers.begin(), pending->leavers.end(), from)) return;
      for (size_t i = 0; i < msg.members.size(); ++i) {
        uint64_t m = msg.members[i];
        if (m != from && members.count(m) && ((inView(m) && !isFailed(m)) || isJoiner(m)))
          holdOrDeclare(from, m, msg, i);
      }
      return;
    case CoordKind::kRecover:
      return onRecover(from, msg);
    case CoordKind::kGrow:
      return onGrow(from, msg);
    case CoordKind::kPrepared:
      return onPrepared(from, msg);
    case CoordKind::kSwitchover:
      return onSwitchover(from, msg);
    case CoordKind::kSwitched:
    case CoordKind::kSwitchFailed:
      return onVote(from, msg);
    case CoordKind::kReconfigure:
      return onReconfigure(from, msg);
    case CoordKind::kGroup:
      return onGroup(from, msg);
    case CoordKind::kMigrate: {
      std::string refused = startMigration(msg.rank, label(from));
      if (!refused.empty()) {
        CoordMessage f;
        f.kind = CoordKind::kPrepareFailed;
        f.text = refused;
        send(members.at(from), f);
      }
      return;
    }
    case CoordKind::kLeave:
      it->second.left = true;
      return;
    default:
      log::warn("coordinator: unexpected {} message from {}", coordKindName(msg.kind), label(from));
  }
}

void CoordinatorCore::holdOrDeclare(uint64_t from, uint64_t accused, const CoordMessage& report, size_t index) {
  const uint64_t neededFrom = report.epoch == epoch ? report.neededFromOf(index) : 0;  // sequence numbers are per epoch
  const Member& m = members.at(accused);
  const bool accusedConnected = m.conn && !m.unreachable;
  if ((report.policy & kReportPeerClosed) && accusedConnected && neededFrom == 0 && opt.closedReportGraceMs > 0) {
    log::info("coordinator: {} says {} closed its lanes; waiting up to {} ms for {}'s own word", label(from),
              label(accused), opt.closedReportGraceMs, label(accused));
    heldReports.push_back({from, accused, epoch, 0, report.text, now + std::chrono::milliseconds(opt.closedReportGraceMs)});
    return;
  }
  declareFailed(accused, fmt::format("reported by {}: {}", label(from), report.text), neededFrom);
}

// A held report stands if, once its time is up, both ends are still what
// they were: the reporter neither failed nor was judged by the accused.
void CoordinatorCore::settleHeldReports() {
  std::vector<HeldReport> due;
  for (auto it = heldReports.begin(); it != heldReports.end();) {
    if (now < it->until) {
      ++it;
      continue;
    }
    due.push_back(std::move(*it));
    it = heldReports.erase(it);
  }
  for (const HeldReport& r : due) {
    auto live = [&](uint64_t m) { return members.count(m) && ((inView(m) && !isFailed(m)) || isJoiner(m)); };
    if (r.epoch != epoch || !live(r.from) || !live(r.accused)) continue;
    declareFailed(r.accused, fmt::format("reported by {}: {}", label(r.from), r.text));
  }
  if (!heldReports.empty() || !failed.empty()) return;
  // Every report came to nothing: those who asked to recover meanwhile
  // hear what they would have heard at once.
  for (uint64_t v : view) {
    auto it = members.find(v);
    if (it == members.end() || it->second.ask != Member::Ask::kRecover) continue;
    it->second.ask = Member::Ask::kNone;
    sendView(v, "nothing to recover: no member of this view has failed");
  }
}

void CoordinatorCore::heartbeat(int slice) {
  CoordMessage one;
  one.kind = CoordKind::kHeartbeat;
  one.epoch = epoch;
  auto beat = std::make_shared<const CoordMessage>(one);
  std::vector<uint64_t> silent;
  const auto limit = std::chrono::milliseconds(opt.heartbeatTimeoutMs);
  std::vector<uint64_t> lost;  // known from a previous coordinator, never back
  for (auto& [mid, m] : members) {
    if (static_cast<int>(m.joinOrder % kBeatSlices) != slice) continue;
    if (m.restored && now - m.lastHeard > limit) lost.push_back(mid);
    if (!m.conn) continue;
    if (now - m.lastHeard > limit) silent.push_back(mid);
    else send(m, beat);
  }
  if (!silent.empty() || !lost.empty()) stateChanged = true;
  for (uint64_t mid : silent)
    if (members.count(mid))  // an earlier declaration may have settled it
      declareFailed(mid, fmt::format("no heartbeat for {} ms (stopped or hung process?)", opt.heartbeatTimeoutMs));
  for (uint64_t mid : lost)
    if (members.count(mid))
      declareFailed(mid, fmt::format("did not reconnect within {} ms after the coordinator changed",
                                     opt.heartbeatTimeoutMs));
}

// The failures so far, for the view's members.
CoordMessage CoordinatorCore::failedNotice(std::string text) const {
  CoordMessage f;
  f.kind = CoordKind::kFailed;
  f.epoch = epoch;
  f.members = failed;
  f.text = std::move(text);
  for (uint64_t m : failed) {
    auto it = failedNeededFrom.find(m);
    f.neededFrom.push_back(it == failedNeededFrom.end() ? 0 : it->second);
  }
  return f;
}

// A member is gone: a lost connection, missed heartbeats, or a peer's report.
// neededFrom: as CoordMessage's (0: it failed).
void CoordinatorCore::declareFailed(uint64_t member, const std::string& reason, uint64_t neededFrom) {
  auto it = members.find(member);
  if (it == members.end()) return;
  std::string who = label(member);
  refuseReconfigurationsNaming(member, fmt::format("{} failed: {}", who, reason));
  bool wasEager = it->second.eager && idleStandby(it->second);
  bool voter = pending && pending->voting && (inView(member) || isJoiner(member));
  if (pending && (inView(member) || isJoiner(member))) {
    std::string loss = fmt::format("{} {} during the reconfiguration: {}", who,
                                   isJoiner(member) ? "(the joiner) died" : "failed", reason);
    if (voter) noteLossDuringVote(member, loss);
    else abortPending(loss);
  }
  it = members.find(member);
  if (it->second.role == Role::kStandby || !inView(member)) {
    log::warn("coordinator: {} is gone: {}", who, reason);
    if (view.empty()) rankOf.erase(member);
    eraseMember(member);
    gone.insert(member);
    if (wasEager) sendStandbys();
    if (voter) decideVote();
    return;
  }
  log::warn("coordinator: {} failed: {}", who, reason);
  // Fence: never readmitted; if it is only stopped it reads this on waking.
  CoordMessage ev;
  ev.kind = CoordKind::kEvicted;
  ev.text = fmt::format("{} was declared failed at epoch {}: {}", who, epoch, reason);
  Member& m = it->second;
  // It is most likely dead: a failure to tell it is expected, not news.
  if (m.conn && !m.unreachable) {
    sendTo(m.conn, ev, CoordAction::Kind::kSendAndClose, /*quiet=*/true);
    memberOfConn.erase(m.conn);
    m.conn = 0;
  }
  closeConnection(m);
  fenced.insert(member);
  fencedPids_.insert(m.pid);
  failed.push_back(member);
  if (neededFrom) failedNeededFrom[member] = neededFrom;
  lastFailure = fmt::format("{} failed: {}", who, reason);
  auto f = std::make_shared<const CoordMessage>(failedNotice(lastFailure));
  for (uint64_t v : view) {
    auto mm = members.find(v);
    if (mm != members.end() && !isFailed(v)) send(mm->second, f);
  }
  refuseGrowAsks(lastFailure);
  breakGroupsOf(member, lastFailure);
  if (voter) return decideVote();
  tryRecover();
}

// A member that said goodbye (kLeave) closed its connection.
void CoordinatorCore::departed(uint64_t mid) {
  bool pendingLeaver = pending && std::count(pending->leavers.begin(), pending->leavers.end(), mid);
  bool needed = pending && !pendingLeaver &&
                (isJoiner(mid) || std::count(pending->next.begin(), pending->next.end(), mid));
  std::string why = fmt::format("{} left the job during the reconfiguration", label(mid));
  bool voting = needed && pending->voting;
  if (voting) noteLossDuringVote(mid, why);
  else if (needed) abortPending(why);
  refuseReconfigurationsNaming(mid, why);
  if (view.empty()) rankOf.erase(mid);
  // A member of the view that left in order still leaves its rank empty:
  // the others' recovery must replace or drop it. It counts as failed for
  // that, silently: nobody is told (its goodbyes have told its peers, and a
  // notice could overtake them and fail their last ops).
  bool emptiesRank = inView(mid) && !isFailed(mid) && !voting && !pendingLeaver;
  if (emptiesRank) {
    failed.push_back(mid);
    lastFailure = fmt::format("{} left the job (it destroyed its communicator)", label(mid));
  }
  eraseMember(mid);
  if (emptiesRank) refuseGrowAsks(lastFailure);
  if (voting) decideVote();
  if (emptiesRank) tryRecover();
}

// Every watched group of a failed member is broken: its other members hear
// it now, and one that registers later at once.
void CoordinatorCore::breakGroupsOf(uint64_t member, const std::string& why) {
  for (auto& [uuid, group] : groups) {
    if (!group.count(member) || brokenGroups.count(uuid)) continue;
    brokenGroups[uuid] = {member, why};
    for (uint64_t m : group) tellGroupBroken(m, uuid, member, why);
  }
}

void CoordinatorCore::tellGroupBroken(uint64_t to, uint64_t uuid, uint64_t failedMember, const std::string& why) {
  auto mm = members.find(to);
  if (to == failedMember || mm == members.end()) return;
  CoordMessage g;
  g.kind = CoordKind::kGroupFailed;
  g.uuid = uuid;
  g.members = {failedMember};
  g.text = why;
  send(mm->second, g);
}

void CoordinatorCore::onGroup(uint64_t from, const CoordMessage& msg) {
  constexpr size_t kMaxGroups = 1 << 16;  // an NCCL job makes a few communicators, not thousands
  if (msg.policy == 1) {  // left in order
    auto it = groups.find(msg.uuid);
    if (it != groups.end() && it->second.erase(from) && it->second.empty()) {
      groups.erase(it);
      brokenGroups.erase(msg.uuid);
    }
    return;
  }
  auto& group = groups[msg.uuid];
  if (groups.size() > kMaxGroups) {
    groups.erase(msg.uuid);
    log::warn("coordinator: {} asked to watch a group beyond the limit of {}; not watched", label(from), kMaxGroups);
    return;
  }
  group.insert(from);
  if (auto broken = brokenGroups.find(msg.uuid); broken != brokenGroups.end())
    tellGroupBroken(from, msg.uuid, broken->second.first, broken->second.second);
}

}  // namespace eccl::membership
