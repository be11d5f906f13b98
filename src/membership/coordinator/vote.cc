// Expected migration: a standby takes a rank's place by two-phase
// reconfiguration. The coordinator announces the next view (PREPARE),
// says when every member of it is prepared (READY), and from then on only
// settles what the members' in-band vote leaves open (docs/elastic.md).
#include <algorithm>

#include "common/log.h"
#include "membership/coordinator/core.h"

namespace eccl::membership {

// Returns why the migration cannot start, or "" once it is announced.
std::string CoordinatorCore::startMigration(int64_t rank, const std::string& asker) {
  if (view.empty()) return "migration refused: the job has not formed yet";
  if (!failed.empty()) return "migration refused: a member has failed; recover first";
  if (rank < 0 || rank >= static_cast<int64_t>(view.size()))
    return fmt::format("migration refused: rank {} is outside [0, {})", rank, view.size());
  if (pending) {
    if (pending->leavingRank == rank) return "";
    return fmt::format("migration refused: rank {} is already being migrated", pending->leavingRank);
  }
  std::vector<uint64_t> standbys = idleStandbys();
  if (standbys.empty()) return fmt::format("migration of rank {} refused: no idle standby is registered", rank);
  Pending p;
  p.epoch = issued = std::max(issued, epoch) + 1;
  p.next = view;
  p.next[static_cast<size_t>(rank)] = standbys[0];
  p.joiners = {standbys[0]};
  p.leavers = {view[static_cast<size_t>(rank)]};
  p.leavingRank = static_cast<int>(rank);
  p.story = fmt::format("rank {} migrated from member {:016x} to standby {:016x}", rank, p.leavers[0], p.joiners[0]);
  pending = std::move(p);
  log::info("coordinator: preparing epoch {} ({}; asked by {})", pending->epoch, pending->story, asker);
  auto shared = std::make_shared<const CoordMessage>(prepareAnnouncement());
  for (uint64_t id : view) send(members.at(id), shared);
  for (uint64_t id : pending->joiners) send(members.at(id), shared);
  return "";
}

CoordMessage CoordinatorCore::prepareAnnouncement() const {
  CoordMessage m;
  m.kind = CoordKind::kPrepare;
  m.epoch = pending->epoch;
  m.rank = pending->leavingRank;
  m.nranks = static_cast<uint32_t>(pending->next.size());
  m.member = pending->joiners[0];
  m.members = pending->leavers;
  m.address = members.at(pending->leavers[0]).address;
  std::vector<ViewEntry> next;
  for (uint64_t id : pending->next) next.push_back({id, members.at(id).address});
  m.encoded = encodeEntries(std::move(next));  // one copy for every member
  m.text = pending->story;
  return m;
}

// A participant of the migration came back to a coordinator that took
// over: whatever of PREPARE and READY the last one sent it may have been
// lost with it, so it hears them again (its client ignores what it had).
void CoordinatorCore::reannouncePending(uint64_t member) {
  if (!pending) return;
  auto all = pendingParticipants();
  if (!std::count(all.begin(), all.end(), member)) return;
  for (uint64_t id : all)  // one of them is gone: the vote is settling without it
    if (!members.count(id)) return;
  Member& m = members.at(member);
  send(m, prepareAnnouncement());
  if (!pending->voting) return;
  CoordMessage ready;
  ready.kind = CoordKind::kPrepareReady;
  ready.epoch = pending->epoch;
  send(m, ready);
}

void CoordinatorCore::abortPending(const std::string& why) {
  if (!pending) return;
  Pending p = std::move(*pending);
  pending.reset();
  lastAbort = fmt::format("the reconfiguration to epoch {} ({}) was aborted: {}", p.epoch, p.story, why);
  log::warn("coordinator: {}", lastAbort);
  for (uint64_t j : p.joiners)
    if (members.count(j)) members.at(j).retired = true;
  std::vector<uint64_t> all = p.next;
  all.insert(all.end(), p.leavers.begin(), p.leavers.end());
  for (uint64_t id : all) {
    auto it = members.find(id);
    if (it == members.end()) continue;
    if (p.switching.count(id) || (p.gaveUp.count(id) && !p.recovering.count(id))) {
      sendError(id, lastAbort);
    } else {
      CoordMessage f;
      f.kind = CoordKind::kPrepareFailed;
      f.epoch = p.epoch;
      f.text = lastAbort;
      send(it->second, f);
    }
  }
}

void CoordinatorCore::onPrepared(uint64_t from, const CoordMessage& msg) {
  if (!pending || msg.epoch != pending->epoch) {
    // An aborted preparation finishing late, or a member telling a new
    // coordinator what it told the last one, whose abort notice it may
    // never have read: it hears the abort (again).
    if (!pending && msg.epoch > epoch && msg.epoch <= issued && members.count(from)) {
      CoordMessage f;
      f.kind = CoordKind::kPrepareFailed;
      f.epoch = msg.epoch;
      f.text = lastAbort.empty() ? fmt::format("the reconfiguration to epoch {} was aborted", msg.epoch) : lastAbort;
      send(members.at(from), f);
    }
    return;
  }
  pending->prepared.insert(from);
  for (uint64_t id : pending->next)
    if (!pending->prepared.count(id)) return;
  if (pending->voting) return;
  log::info("coordinator: every member of epoch {} is prepared", pending->epoch);
  pending->voting = true;
  CoordMessage ready;
  ready.kind = CoordKind::kPrepareReady;
  ready.epoch = pending->epoch;
  auto r = std::make_shared<const CoordMessage>(ready);
  for (uint64_t id : pendingParticipants())
    if (members.count(id)) send(members.at(id), r);
}

// A leaver at its last boundary: it learns the outcome of the vote.
void CoordinatorCore::onSwitchover(uint64_t from, const CoordMessage& msg) {
  // Committed already, and maybe a recovery after it: a member out of the
  // view that asks about a past epoch left at that epoch's vote (an aborted
  // one keeps its leaver in the view).
  if (msg.epoch <= epoch && !inView(from) && !isJoiner(from)) return sendView(from, "left the view");
  if (!pending || msg.epoch != pending->epoch) {
    sendError(from, fmt::format("switchover to epoch {} refused: no such reconfiguration is prepared{}{}", msg.epoch,
                                lastAbort.empty() ? "" : "; ", lastAbort));
    return;
  }
  pending->switching.insert(from);
}

void CoordinatorCore::onVote(uint64_t from, const CoordMessage& msg) {
  bool yes = msg.kind == CoordKind::kSwitched;
  if (!pending || msg.epoch != pending->epoch) {
    // Settled already: a late yes is in the view; a late no waits for it.
    if (!yes && msg.epoch == epoch && inView(from)) sendView(from, "the vote committed without this member");
    else if (!yes)
      sendError(from, fmt::format("switchover to epoch {}: {}", msg.epoch,
                                  lastAbort.empty() ? "no such reconfiguration" : lastAbort));
    return;
  }
  if (!std::count(pending->next.begin(), pending->next.end(), from)) return;
  if (!pending->voting) {
    // Nobody votes before READY (the member waits for it), so this is a
    // member that broke the protocol: the vote cannot be trusted.
    sendError(from, "switchover vote before every member was prepared");
    return;
  }
  if (yes) {
    pending->votedYes.insert(from);
  } else {
    pending->gaveUp.insert(from);
    if (pending->firstLoss.empty()) pending->firstLoss = fmt::format("{}: {}", label(from), msg.text);
  }
  decideVote();
}

void CoordinatorCore::noteLossDuringVote(uint64_t member, const std::string& why) {
  pending->lost.insert(member);
  // A death explains an abort better than the failed votes it caused.
  if (!pending->firstLossIsDeath) pending->firstLoss = why, pending->firstLossIsDeath = true;
  // Joiners are nobody's view members yet and hear of no failure, nor
  // does anyone hear of a joiner's: tell them, so votes waiting on the
  // lost member end now even where no connection to it broke.
  CoordMessage f;
  f.kind = CoordKind::kFailed;
  f.epoch = epoch;
  f.members = {member};
  f.text = why;
  for (uint64_t id : isJoiner(member) ? pendingParticipants() : pending->joiners)
    if (id != member && members.count(id)) send(members.at(id), f);
}

void CoordinatorCore::decideVote() {
  if (!pending || !pending->voting) return;
  if (!pending->votedYes.empty()) return commitVote();
  for (uint64_t id : pending->next) {
    bool settled = pending->gaveUp.count(id) || pending->lost.count(id) || !members.count(id) || isFailed(id);
    if (!settled) return;  // still voting: it may yet see yes
  }
  issued = std::max(issued, pending->epoch);
  abortPending(pending->firstLoss.empty() ? "the switchover vote failed" : pending->firstLoss);
  tryRecover();
}

// Someone saw every member vote yes and runs in the next view already.
void CoordinatorCore::commitVote() {
  Pending p = std::move(*pending);
  pending.reset();
  lastAbort.clear();
  auto inNext = [&](uint64_t m) { return std::count(p.next.begin(), p.next.end(), m) > 0; };
  // Failures in the old view stay failures if they are in the next one;
  // a joiner that died after its vote is one too.
  std::vector<uint64_t> stillFailed;
  for (uint64_t m : failed)
    if (inNext(m)) stillFailed.push_back(m);
    else eraseMember(m);
  for (uint64_t m : p.lost)
    if (inNext(m) && !std::count(stillFailed.begin(), stillFailed.end(), m)) {
      stillFailed.push_back(m);
      fenced.insert(m);
      if (auto it = members.find(m); it != members.end()) fencedPids_.insert(it->second.pid);
    }
  for (uint64_t j : p.joiners)
    if (members.count(j)) members.at(j).role = Role::kRank;
  for (auto& [mid, mm] : members) mm.ask = Member::Ask::kNone;
  replaceView(p.next);
  failed = stillFailed;
  failedNeededFrom.clear();  // failed in the old epoch: every op of this one needs them
  epoch = p.epoch;
  issued = std::max(issued, epoch);
  log::info("coordinator: epoch {} with {} ranks ({}; voted in band)", epoch, view.size(), p.story);
  for (uint64_t m : p.gaveUp)
    if (inNext(m) && !isFailed(m)) sendView(m, p.story);
  for (uint64_t l : p.leavers)
    if (p.switching.count(l)) sendView(l, p.story);  // rank -1: it has left the view
  announceViewToStandbys();
  if (failed.empty()) return;
  auto f = std::make_shared<const CoordMessage>(failedNotice(p.firstLoss));
  for (uint64_t m : view) {
    auto mm = members.find(m);
    if (mm != members.end() && !isFailed(m)) send(mm->second, f);
  }
}

}  // namespace eccl::membership
