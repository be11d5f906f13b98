#include "membership/coordinator.h"

#include <poll.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "membership/coord_channel.h"
#include "membership/handshake.h"
#include "membership/handshake_gate.h"
#include "common/error.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/netif.h"
#include "common/params.h"

namespace eccl::membership {

namespace {

// Best effort: a member that cannot take a message is dealt with by its
// heartbeat or its closed connection, not here. Returns whether it went.
bool trySend(SealedChannel& ch, const CoordMessage& msg, int64_t ms, bool quiet = false) {
  try {
    ch.send(msg, deadlineAfterMs(ms));
    return true;
  } catch (const Error& e) {
    if (!quiet) log::warn("coordinator: {}", e.what());
    return false;
  }
}

}  // namespace

struct Coordinator::State {
  struct Member {
    uint64_t id = 0;
    Role role = Role::kRank;
    std::string address;
    uint64_t pid = 0;
    uint64_t joinOrder = 0;
    std::unique_ptr<SealedChannel> channel;
    Clock::time_point lastHeard;
    enum class Ask { kNone, kRecover, kGrow } ask = Ask::kNone;
    uint32_t askArg = 0;  // the recovery policy, or how many ranks to grow by
    bool left = false;    // said goodbye; its end of file is no failure
    bool eager = false;   // a standby that keeps connections to the members open
    bool retired = false; // a joiner of an aborted migration: no longer a standby
    bool reserved = false; // held for a REPLACE that waits for more standbys
    bool leftOut = false;  // left out of a named membership; has not yet asked as the standby it now is
    // A send to it failed: its connection is broken and its end of file or
    // silence will declare it; until then nothing more is sent (when many
    // members die at once, each notice would otherwise try, and log, every
    // dead one: N^2 of each).
    bool unreachable = false;
  };

  // A reconfiguration being prepared (expected migration): the next view
  // exists and members open its delta in the background. Once all are
  // prepared (READY) the members vote in band at their switchover and the
  // view becomes current on their own links; from then on only the vote
  // decides: a member that voted yes may already run in the next view, so
  // the coordinator never aborts on its own, it waits until every live
  // member of the next view has reported and commits if anyone saw yes.
  struct Pending {
    uint32_t epoch = 0;
    std::vector<uint64_t> next;
    std::vector<uint64_t> joiners, leavers;
    int leavingRank = -1;
    std::set<uint64_t> prepared;
    std::set<uint64_t> switching;  // leavers at their last boundary, waiting for the outcome
    bool voting = false;           // READY went out
    std::set<uint64_t> votedYes, gaveUp, lost;
    std::set<uint64_t> recovering;  // gave up by asking to recover: an abort answers them with the recovery
    std::string firstLoss;         // the first death (else failed vote): the reason of an abort
    bool firstLossIsDeath = false;
    std::string story;
  };

  UniqueIdData id;
  Fd listenFd;
  CoordinatorOptions opt;
  std::map<uint64_t, Member> members;
  std::set<uint64_t> fenced;
  std::set<uint64_t> departed;  // registered once, gone since (a failed member is fenced instead)
  uint64_t joins = 0;
  uint32_t nranks = 0;
  uint32_t epoch = 0;
  uint32_t issued = 0;            // highest epoch ever announced: an aborted vote's number is never reused
  std::vector<uint64_t> view;     // rank -> member; empty until formed
  std::vector<uint64_t> failed;   // members of `view` failed in this epoch
  // Those of `failed` that left in order, reported by a member whose
  // collective of this sequence number needed them (CoordMessage::neededFrom).
  std::map<uint64_t, uint64_t> failedNeededFrom;
  // Watched groups (kGroup): uuid -> members; and why each broken one broke.
  std::map<uint64_t, std::set<uint64_t>> groups;
  std::map<uint64_t, std::pair<uint64_t, std::string>> brokenGroups;  // uuid -> (failed member, why)
  std::string lastFailure;
  bool eagerListSent = false;     // the last standby list sent named someone
  std::optional<Pending> pending;
  std::string lastAbort;
  // A REPLACE short of standbys, held (opt.replaceWaitMs) until this time.
  std::optional<Clock::time_point> replaceHeldUntil;
  // Memberships named outright (kReconfigure), by asker; each uuid names
  // one view at most, ever.
  struct ReconfigureAsk {
    uint64_t uuid = 0;
    std::vector<uint64_t> members;
  };
  std::map<uint64_t, ReconfigureAsk> reconfigureAsks;
  std::map<uint64_t, uint32_t> usedUuids;  // uuid -> the epoch it made
  std::map<uint64_t, std::string> refusedUuids;  // uuid -> why: a late caller hears the same
  uint64_t viewUuid = 0;                  // the uuid that made the current view (0: another cause)

  std::string label(uint64_t member) const {
    auto it = std::find(view.begin(), view.end(), member);
    auto m = members.find(member);
    std::string where = m == members.end() ? "" : fmt::format(" at {}", m->second.address);
    if (it != view.end()) return fmt::format("rank {} (member {:016x}{})", it - view.begin(), member, where);
    return fmt::format("member {:016x}{}", member, where);
  }

  std::vector<ViewEntry> entries() const {
    std::vector<ViewEntry> out;
    for (uint64_t m : view) {
      auto it = members.find(m);
      out.push_back({m, it == members.end() ? "" : it->second.address});
    }
    return out;
  }

  void send(Member& m, const CoordMessage& msg) {
    if (!m.channel || m.unreachable) return;
    if (!trySend(*m.channel, msg, 1000)) m.unreachable = true;
  }

  void sendView(uint64_t member, const std::string& why) {
    auto it = members.find(member);
    if (it == members.end()) return;
    CoordMessage v;
    v.kind = CoordKind::kView;
    v.epoch = epoch;
    auto pos = std::find(view.begin(), view.end(), member);
    v.rank = pos == view.end() ? -1 : pos - view.begin();
    v.nranks = static_cast<uint32_t>(view.size());
    v.entries = entries();
    v.text = why;
    v.uuid = viewUuid;
    send(it->second, v);
  }

  void sendError(uint64_t member, const std::string& text) {
    auto it = members.find(member);
    if (it == members.end()) return;
    CoordMessage e;
    e.kind = CoordKind::kError;
    e.text = text;
    send(it->second, e);
  }

  bool inView(uint64_t member) const { return std::find(view.begin(), view.end(), member) != view.end(); }
  bool isFailed(uint64_t member) const { return std::find(failed.begin(), failed.end(), member) != failed.end(); }

  void form() {
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

  bool usableStandby(const Member& m) const {
    return m.role == Role::kStandby && m.channel && !m.retired && !m.leftOut;
  }
  bool idleStandby(const Member& m) const { return usableStandby(m) && !m.reserved; }

  // In registration order; with `withReserved`, the standbys a held REPLACE
  // reserved count too (they are its to use).
  std::vector<uint64_t> idleStandbys(bool withReserved = false) const {
    std::vector<uint64_t> out;
    for (auto& [mid, m] : members)
      if (withReserved ? usableStandby(m) : idleStandby(m)) out.push_back(mid);
    std::sort(out.begin(), out.end(),
              [&](uint64_t a, uint64_t b) { return members.at(a).joinOrder < members.at(b).joinOrder; });
    return out;
  }

  // Members keep connections to eager standbys open, so promoting one opens
  // nothing; standbys learn every new view for the same reason.
  // An empty list after an empty one is news to nobody (a member starts
  // with none): it is not sent, so a view change wakes no member for it.
  void sendStandbys() {
    if (view.empty()) return;
    CoordMessage list;
    list.kind = CoordKind::kStandbys;
    list.epoch = epoch;
    for (uint64_t mid : idleStandbys())
      if (members.at(mid).eager) list.entries.push_back({mid, members.at(mid).address});
    if (list.entries.empty() && !eagerListSent) return;
    eagerListSent = !list.entries.empty();
    for (uint64_t m : view) {
      auto it = members.find(m);
      if (it != members.end() && !isFailed(m)) send(it->second, list);
    }
  }

  void announceViewToStandbys() {
    for (uint64_t mid : idleStandbys()) sendView(mid, "current view");
    sendStandbys();
  }
  std::map<uint64_t, int64_t> rankOf;  // requested ranks before formation

  void onJoin(std::unique_ptr<SealedChannel> ch, const CoordMessage& msg) {
    if (msg.role == Role::kTool) {
      CoordMessage s;
      s.kind = CoordKind::kStatus;
      s.text = statusText();
      if (msg.kind == CoordKind::kMigrate) {
        std::string refused = startMigration(msg.rank, fmt::format("a tool at {}", ch->peer()));
        if (!refused.empty()) s.kind = CoordKind::kError, s.text = refused;
        else s.text = fmt::format("migration of rank {} prepared\n{}", msg.rank, statusText());
      }
      trySend(*ch, s, 1000);
      return;
    }
    auto refuse = [&](const std::string& why) {
      log::warn("coordinator: refused {} from {}: {}", msg.role == Role::kRank ? "a rank" : "a standby",
                ch->peer(), why);
      CoordMessage e;
      e.kind = fenced.count(msg.member) ? CoordKind::kEvicted : CoordKind::kError;
      e.text = why;
      trySend(*ch, e, 1000);
    };
    if (fenced.count(msg.member)) return refuse("this member was declared failed and is fenced");
    if (members.count(msg.member) || msg.member == 0) return refuse("member id is already in use");
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
    m.lastHeard = Clock::now();
    ch->setPeer(fmt::format("member {:016x} ({})", msg.member, ch->peer()));
    m.channel = std::move(ch);
    uint64_t mid = msg.member;
    members[mid] = std::move(m);
    if (msg.role == Role::kStandby) {
      log::info("coordinator: standby member {:016x} registered at {}{}", mid, msg.address,
                members.at(mid).eager ? " (eager)" : "");
      sendView(mid, "registered as a standby");
      if (members.at(mid).eager) sendStandbys();
      if (replaceHeldUntil) tryRecover();  // a held REPLACE may be complete now
    } else if (rankOf.size() == nranks) {
      form();
    }
  }

  // A member is gone: a lost connection, missed heartbeats, or a peer's report.
  // The failures so far, for the view's members.
  CoordMessage failedNotice(std::string text) const {
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

  // Every watched group of a failed member is broken: its other members hear
  // it now, and one that registers later at once.
  void breakGroupsOf(uint64_t member, const std::string& why) {
    for (auto& [uuid, group] : groups) {
      if (!group.count(member) || brokenGroups.count(uuid)) continue;
      brokenGroups[uuid] = {member, why};
      for (uint64_t m : group) tellGroupBroken(m, uuid, member, why);
    }
  }

  void tellGroupBroken(uint64_t to, uint64_t uuid, uint64_t failedMember, const std::string& why) {
    auto mm = members.find(to);
    if (to == failedMember || mm == members.end() || !mm->second.channel) return;
    CoordMessage g;
    g.kind = CoordKind::kGroupFailed;
    g.uuid = uuid;
    g.members = {failedMember};
    g.text = why;
    send(mm->second, g);
  }

  void onGroup(uint64_t from, const CoordMessage& msg) {
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

  // neededFrom: as CoordMessage's (0: it failed).
  void declareFailed(uint64_t member, const std::string& reason, uint64_t neededFrom = 0) {
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
      members.erase(it);
      departed.insert(member);
      if (wasEager) sendStandbys();
      if (voter) decideVote();
      return;
    }
    log::warn("coordinator: {} failed: {}", who, reason);
    // Fence: never readmitted; if it is only stopped it reads this on waking.
    CoordMessage ev;
    ev.kind = CoordKind::kEvicted;
    ev.text = fmt::format("{} was declared failed at epoch {}: {}", who, epoch, reason);
    // It is most likely dead: a failure to tell it is expected, not news.
    if (it->second.channel && !it->second.unreachable) trySend(*it->second.channel, ev, 50, /*quiet=*/true);
    fenced.insert(member);
    failed.push_back(member);
    if (neededFrom) failedNeededFrom[member] = neededFrom;
    lastFailure = fmt::format("{} failed: {}", who, reason);
    it->second.channel.reset();
    CoordMessage f = failedNotice(lastFailure);
    for (uint64_t m : view) {
      auto mm = members.find(m);
      if (mm != members.end() && mm->second.channel && !isFailed(m)) send(mm->second, f);
    }
    breakGroupsOf(member, lastFailure);
    if (voter) {
      decideVote();
      return;
    }
    tryRecover();
  }

  void onRecover(uint64_t from, const CoordMessage& msg) {
    if (msg.epoch != epoch) {
      sendError(from, fmt::format("recovery asked at epoch {}, the current epoch is {}", msg.epoch, epoch));
      return;
    }
    if (failed.empty()) {
      sendView(from, "nothing to recover: no member of this view has failed");
      return;
    }
    Member& m = members.at(from);
    m.ask = Member::Ask::kRecover;
    m.askArg = msg.policy;
    // A member of the next view asking to recover has given up its vote.
    if (pending && pending->voting && std::count(pending->next.begin(), pending->next.end(), from)) {
      pending->gaveUp.insert(from);
      pending->recovering.insert(from);
      return decideVote();
    }
    tryRecover();
  }

  // The members of the view still alive if every one of them has asked for
  // `ask`; nothing if someone has not yet.
  std::optional<std::vector<uint64_t>> everyoneAsked(Member::Ask ask) {
    std::vector<uint64_t> waiting;
    for (uint64_t m : view) {
      if (isFailed(m)) continue;
      auto it = members.find(m);
      if (it == members.end() || it->second.ask != ask) return std::nullopt;
      waiting.push_back(m);
    }
    if (waiting.empty()) return std::nullopt;
    return waiting;
  }

  void releaseReservations() {
    replaceHeldUntil.reset();
    for (auto& [mid, m] : members) m.reserved = false;
  }

  void refuseAll(const std::vector<uint64_t>& waiting, const std::string& what, const std::string& why) {
    releaseReservations();
    log::warn("coordinator: {} refused: {}", what, why);
    for (uint64_t m : waiting) {
      members.at(m).ask = Member::Ask::kNone;
      sendError(m, why);
    }
  }

  // The single place a new view becomes current.
  void commitView(std::vector<uint64_t> next, const std::vector<uint64_t>& promoted, const std::string& story,
                  const std::vector<uint64_t>& leavers, uint64_t uuid = 0) {
    viewUuid = uuid;
    for (uint64_t m : failed) members.erase(m);
    for (uint64_t m : promoted) members.at(m).role = Role::kRank;
    for (auto& [mid, mm] : members) mm.ask = Member::Ask::kNone;
    releaseReservations();
    view = std::move(next);
    failed.clear();
    failedNeededFrom.clear();
    epoch = issued = std::max(issued, epoch) + 1;
    log::info("coordinator: epoch {} with {} ranks ({})", epoch, view.size(), story);
    for (uint64_t m : view) sendView(m, story);
    for (uint64_t m : leavers) sendView(m, story);  // rank -1: it has left the view
    announceViewToStandbys();
  }

  void onGrow(uint64_t from, const CoordMessage& msg) {
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
      if (members.at(w).askArg != count) return refuseAll(*waiting, "grow", "the ranks asked to grow by different counts");
    std::vector<uint64_t> standbys = idleStandbys();
    if (count == 0 || standbys.size() < count)
      return refuseAll(*waiting, "grow",
                       fmt::format("grow by {} needs that many registered standbys; {} are idle", count, standbys.size()));
    standbys.resize(count);
    std::vector<uint64_t> next = view;
    next.insert(next.end(), standbys.begin(), standbys.end());
    commitView(next, standbys, fmt::format("grew from {} to {} ranks", view.size(), next.size()), {});
  }

  bool isJoiner(uint64_t m) const {
    return pending && std::find(pending->joiners.begin(), pending->joiners.end(), m) != pending->joiners.end();
  }

  // Returns why the migration cannot start, or "" once it is announced.
  std::string startMigration(int64_t rank, const std::string& asker) {
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
    CoordMessage m;
    m.kind = CoordKind::kPrepare;
    m.epoch = pending->epoch;
    m.rank = rank;
    m.nranks = static_cast<uint32_t>(pending->next.size());
    m.member = pending->joiners[0];
    m.members = pending->leavers;
    m.address = members.at(pending->leavers[0]).address;
    for (uint64_t id : pending->next) m.entries.push_back({id, members.at(id).address});
    m.text = pending->story;
    for (uint64_t id : view) send(members.at(id), m);
    for (uint64_t id : pending->joiners) send(members.at(id), m);
    return "";
  }

  std::vector<uint64_t> pendingParticipants() const {
    std::vector<uint64_t> all = pending->next;
    all.insert(all.end(), pending->leavers.begin(), pending->leavers.end());
    return all;
  }

  void abortPending(const std::string& why) {
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

  void onPrepared(uint64_t from, const CoordMessage& msg) {
    if (!pending || msg.epoch != pending->epoch) return;  // an aborted preparation finishing late
    pending->prepared.insert(from);
    for (uint64_t id : pending->next)
      if (!pending->prepared.count(id)) return;
    if (pending->voting) return;
    log::info("coordinator: every member of epoch {} is prepared", pending->epoch);
    pending->voting = true;
    CoordMessage r;
    r.kind = CoordKind::kPrepareReady;
    r.epoch = pending->epoch;
    for (uint64_t id : pendingParticipants())
      if (members.count(id)) send(members.at(id), r);
  }

  // A leaver at its last boundary: it learns the outcome of the vote.
  void onSwitchover(uint64_t from, const CoordMessage& msg) {
    if (!pending && msg.epoch == epoch && !inView(from)) return sendView(from, "left the view");  // committed already
    if (!pending || msg.epoch != pending->epoch) {
      sendError(from, fmt::format("switchover to epoch {} refused: no such reconfiguration is prepared{}{}", msg.epoch,
                                  lastAbort.empty() ? "" : "; ", lastAbort));
      return;
    }
    pending->switching.insert(from);
  }

  void onVote(uint64_t from, const CoordMessage& msg) {
    bool yes = msg.kind == CoordKind::kSwitched;
    if (!pending || msg.epoch != pending->epoch) {
      // Settled already: a late yes is in the view; a late no waits for it.
      if (!yes && msg.epoch == epoch && inView(from)) sendView(from, "the vote committed without this member");
      else if (!yes) sendError(from, fmt::format("switchover to epoch {}: {}", msg.epoch, lastAbort.empty() ? "no such reconfiguration" : lastAbort));
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

  void noteLossDuringVote(uint64_t member, const std::string& why) {
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

  void decideVote() {
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
  void commitVote() {
    Pending p = std::move(*pending);
    pending.reset();
    lastAbort.clear();
    auto inNext = [&](uint64_t m) { return std::count(p.next.begin(), p.next.end(), m) > 0; };
    // Failures in the old view stay failures if they are in the next one;
    // a joiner that died after its vote is one too.
    std::vector<uint64_t> stillFailed;
    for (uint64_t m : failed)
      if (inNext(m)) stillFailed.push_back(m);
      else members.erase(m);
    for (uint64_t m : p.lost)
      if (inNext(m) && !std::count(stillFailed.begin(), stillFailed.end(), m)) {
        stillFailed.push_back(m);
        fenced.insert(m);
      }
    for (uint64_t j : p.joiners)
      if (members.count(j)) members.at(j).role = Role::kRank;
    for (auto& [mid, mm] : members) mm.ask = Member::Ask::kNone;
    view = p.next;
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
    CoordMessage f = failedNotice(p.firstLoss);
    for (uint64_t m : view) {
      auto mm = members.find(m);
      if (mm != members.end() && mm->second.channel && !isFailed(m)) send(mm->second, f);
    }
  }

  std::string describeMembers(const std::vector<uint64_t>& list) const {
    std::string out;
    for (uint64_t m : list) out += fmt::format("{}{:016x}", out.empty() ? "[" : ", ", m);
    return out + "]";
  }

  // Refuses every ask of `uuid` (all of them when 0 is not meant) with `why`.
  void refuseReconfiguration(uint64_t uuid, const std::string& why) {
    std::vector<uint64_t> askers;
    for (auto& [asker, ask] : reconfigureAsks)
      if (ask.uuid == uuid) askers.push_back(asker);
    log::warn("coordinator: reconfiguration {:016x} refused: {}", uuid, why);
    refusedUuids.emplace(uuid, why);
    for (uint64_t a : askers) {
      reconfigureAsks.erase(a);
      sendError(a, fmt::format("reconfiguration {:016x} refused: {}", uuid, why));
    }
  }

  void refuseReconfigurationsNaming(uint64_t member, const std::string& why) {
    std::set<uint64_t> uuids;
    for (auto& [asker, ask] : reconfigureAsks)
      if (asker == member || std::count(ask.members.begin(), ask.members.end(), member)) uuids.insert(ask.uuid);
    for (uint64_t u : uuids) refuseReconfiguration(u, fmt::format("a member it names is gone: {}", why));
  }

  bool notRegisteredYet(uint64_t m) const { return !members.count(m) && !fenced.count(m) && !departed.count(m); }

  // Why `m` cannot be in a named membership, or "".
  std::string unfitForReconfiguration(uint64_t m) const {
    auto it = members.find(m);
    if (it == members.end() || fenced.count(m))
      return fmt::format("member {:016x} is not registered with this job (it exited, failed, or belongs to another job)", m);
    if (isFailed(m)) return fmt::format("{} has failed", label(m));
    if (!inView(m) && !usableStandby(it->second) && !it->second.leftOut)
      return fmt::format("member {:016x} is neither in the current view nor an idle standby", m);
    return "";
  }

  // A membership named outright: the view becomes `members`, in that order,
  // once every member it names has asked with the same list and uuid.
  // Members of the current view it leaves out are leavers; standbys it names
  // are promoted; connections between members kept are inherited.
  void onReconfigure(uint64_t from, const CoordMessage& msg) {
    auto fail = [&](const std::string& why) { sendError(from, fmt::format("reconfiguration {:016x} refused: {}", msg.uuid, why)); };
    // A member left out of the last membership that asks before it has
    // heard so (it asks as a member, epoch != 0) asks again once it has
    // dropped its old links: until then the others must not dial it, or
    // it would close their new links with its old ones.
    if (auto it = members.find(from); it != members.end() && it->second.leftOut) {
      if (msg.epoch != 0) return;
      it->second.leftOut = false;
    }
    if (auto refused = refusedUuids.find(msg.uuid); refused != refusedUuids.end()) return fail(refused->second);
    if (auto used = usedUuids.find(msg.uuid); used != usedUuids.end())
      return fail(fmt::format("uuid {:016x} already made epoch {}; every reconfiguration needs a fresh uuid", msg.uuid,
                              used->second));
    if (view.empty() && !rankOf.empty())
      return fail("the job is forming from ranks registered by init; a reconfiguration cannot form it");
    if (inView(from) && msg.epoch != epoch)
      return fail(fmt::format("asked at epoch {}, the current epoch is {}", msg.epoch, epoch));
    std::set<uint64_t> distinct(msg.members.begin(), msg.members.end());
    if (msg.members.empty() || distinct.size() != msg.members.size())
      return fail(fmt::format("the membership {} is empty or names a member twice", describeMembers(msg.members)));
    if (!distinct.count(from)) return fail(fmt::format("the asker {} is not in the membership it names", label(from)));
    // A member named before its registration reached us (the ids travel
    // faster than a kJoin on another connection) is waited for like one
    // that has not asked yet; the callers' deadlines bound the wait.
    for (uint64_t m : msg.members)
      if (!notRegisteredYet(m))
        if (std::string why = unfitForReconfiguration(m); !why.empty()) return fail(why);
    reconfigureAsks[from] = {msg.uuid, msg.members};
    // Everyone asking with this uuid must name the same membership.
    for (auto& [asker, ask] : reconfigureAsks) {
      if (asker == from || ask.uuid != msg.uuid || ask.members == msg.members) continue;
      return refuseReconfiguration(
          msg.uuid, fmt::format("callers disagree: {} named {}, {} named {}", label(asker),
                                describeMembers(ask.members), label(from), describeMembers(msg.members)));
    }
    for (uint64_t m : msg.members) {
      auto a = reconfigureAsks.find(m);
      if (a == reconfigureAsks.end() || a->second.uuid != msg.uuid) return;  // still waiting for m
    }
    commitReconfiguration(msg.uuid, msg.members);
  }

  void commitReconfiguration(uint64_t uuid, const std::vector<uint64_t>& next) {
    if (pending) abortPending(fmt::format("superseded by reconfiguration {:016x}", uuid));
    std::vector<uint64_t> leavers, promoted;
    for (uint64_t m : view)
      if (!std::count(next.begin(), next.end(), m) && !isFailed(m) && members.count(m)) leavers.push_back(m);
    for (uint64_t m : next)
      if (!inView(m)) promoted.push_back(m);
    size_t kept = next.size() - promoted.size();
    std::string story = fmt::format("reconfiguration {:016x}: {} kept, {} joined, {} left{}", uuid, kept,
                                    promoted.size(), leavers.size() + failed.size(),
                                    failed.empty() ? "" : fmt::format(" ({} failed)", failed.size()));
    for (uint64_t m : next) reconfigureAsks.erase(m);
    usedUuids[uuid] = std::max(issued, epoch) + 1;
    // A member left out stays registered as a standby: a later membership
    // may name it again (torchft's quorum leaves out a replica that was
    // late and takes it back at the next quorum).
    for (uint64_t l : leavers) {
      members.at(l).role = Role::kStandby;
      members.at(l).leftOut = true;
    }
    commitView(next, promoted, story, leavers, uuid);
    // Asks for other memberships by members of this view are superseded.
    std::set<uint64_t> stale;
    for (auto& [asker, ask] : reconfigureAsks)
      if (inView(asker)) stale.insert(ask.uuid);
    for (uint64_t u : stale) refuseReconfiguration(u, fmt::format("superseded by epoch {} ({})", epoch, story));
  }

  void tryRecover() {
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
        replaceHeldUntil = Clock::now() + std::chrono::milliseconds(opt.replaceWaitMs);
        log::info("coordinator: REPLACE needs {} standby(s), {} registered; holding it up to {} ms for more",
                  failed.size(), standbys.size(), opt.replaceWaitMs);
      }
      if (replaceHeldUntil && Clock::now() < *replaceHeldUntil) {
        for (uint64_t sb : standbys) members.at(sb).reserved = true;
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

  void onMessage(uint64_t from, const CoordMessage& msg) {
    auto it = members.find(from);
    if (it == members.end()) return;
    it->second.lastHeard = Clock::now();
    switch (msg.kind) {
      case CoordKind::kHeartbeat:
        return;
      case CoordKind::kReport:
        if (!inView(from) && !isJoiner(from)) return;  // a leaver's view of a world it left
        for (size_t i = 0; i < msg.members.size(); ++i) {
          uint64_t m = msg.members[i];
          if (m != from && members.count(m) && ((inView(m) && !isFailed(m)) || isJoiner(m)))
            declareFailed(m, fmt::format("reported by {}: {}", label(from), msg.text),
                          msg.epoch == epoch ? msg.neededFromOf(i) : 0);  // sequence numbers are per epoch
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
          send(it->second, f);
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

  std::string statusText() const {
    std::string s;
    if (view.empty()) {
      std::string missing;
      for (uint32_t r = 0; r < nranks; ++r) {
        bool here = false;
        for (auto& [mid, rr] : rankOf) here = here || rr == r;
        if (!here) missing += fmt::format("{}{}", missing.empty() ? "" : ",", r);
      }
      s = fmt::format("forming: {} of {} ranks registered (missing: {})\n", rankOf.size(), nranks, missing);
    } else {
      s = fmt::format("epoch {}, {} ranks\n", epoch, view.size());
    }
    auto now = Clock::now();
    for (size_t r = 0; r < view.size(); ++r) {
      auto it = members.find(view[r]);
      if (it == members.end() || isFailed(view[r])) {
        s += fmt::format("  rank {}: member {:016x} FAILED\n", r, view[r]);
        continue;
      }
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - it->second.lastHeard).count();
      s += fmt::format("  rank {}: member {:016x} at {} pid {} healthy (heard {} ms ago)\n", r, view[r],
                       it->second.address, it->second.pid, ms);
    }
    for (auto& [mid, m] : members)
      if (m.role == Role::kStandby)
        s += fmt::format("  standby: member {:016x} at {} pid {}{}{}\n", mid, m.address, m.pid,
                         m.eager ? " (eager)" : "", m.retired ? " (retired: its migration was aborted)" : "");
    if (pending)
      s += fmt::format("  preparing epoch {}: {} ({} of {} prepared{})\n", pending->epoch, pending->story,
                       pending->prepared.size(), pending->next.size(),
                       pending->voting ? fmt::format(", voting: {} yes, {} gave up, {} lost", pending->votedYes.size(),
                                                     pending->gaveUp.size(), pending->lost.size())
                                       : "");
    for (auto& [asker, ask] : reconfigureAsks)
      s += fmt::format("  reconfiguration {:016x} asked by {} for {}\n", ask.uuid, label(asker), describeMembers(ask.members));
    for (auto& [asker, ask] : reconfigureAsks)
      s += fmt::format("  reconfiguration {:016x} asked by {} for {}\n", ask.uuid, label(asker), describeMembers(ask.members));
    if (replaceHeldUntil)
      s += fmt::format("  REPLACE held for {} failed rank(s): {} standby(s) reserved, {} ms left to wait for more\n",
                       failed.size(), idleStandbys(true).size(), std::max<int64_t>(0, msUntil(*replaceHeldUntil)));
    if (!lastAbort.empty()) s += fmt::format("  last aborted reconfiguration: {}\n", lastAbort);
    if (!lastFailure.empty()) s += fmt::format("  last failure: {}\n", lastFailure);
    return s;
  }
};

Coordinator::Coordinator(const UniqueIdData& id, Fd listenFd, const CoordinatorOptions& options)
    : state_(std::make_unique<State>()) {
  state_->id = id;
  state_->listenFd = std::move(listenFd);
  state_->opt = options;
  thread_ = std::thread([this] {
    try {
      run();
    } catch (const std::exception& e) {
      log::warn("coordinator stopped: {}", e.what());
    }
    releaseThreadCryptoState();
  });
}

std::set<uint64_t> Coordinator::idleStandbyPids() const {
  MutexLock lock(snapshotMu_);
  return idleStandbyPids_;
}

std::set<uint64_t> Coordinator::viewPids() const {
  MutexLock lock(snapshotMu_);
  return viewPids_;
}

Coordinator::~Coordinator() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
}

namespace {

// An authenticated connection whose first message (join, status query or
// migration request) has not arrived yet: read as it comes, like a
// member's, so even a slow member holds up nobody.
struct Unjoined {
  std::unique_ptr<SealedChannel> channel;
  Deadline deadline;
  std::string what;
};

}  // namespace

void Coordinator::run() {
  State& s = *state_;
  // Connections are admitted beside the members' service, never inline:
  // a silent or hostile one occupies a gate slot, not this loop.
  GateOptions gateOptions;
  gateOptions.handshakeTimeoutMs = s.opt.handshakeTimeoutMs;
  gateOptions.maxPending = s.opt.maxUnauthenticated;
  HandshakeGate gate(s.id.secret, s.id.jobId, gateOptions, "coordinator");
  gate.addListener(s.listenFd.get(), [&s](std::string* from) {
    SockAddr peer;
    Fd fd = acceptUntil(s.listenFd.get(), Clock::now(), &peer);
    if (fd) *from = peer.str();
    return fd;
  });
  std::vector<Unjoined> unjoined;
  // Each authenticated connection's first message decides what it is; the
  // rest (a heartbeat that followed its join) are the new member's.
  auto serveUnjoined = [&s](std::vector<Unjoined>& unjoined) {
    std::vector<Unjoined> waiting;
    for (size_t i = 0; i < unjoined.size(); ++i) {
      Unjoined& u = unjoined[i];
      try {
        std::vector<CoordMessage> got;
        bool open = u.channel->drain(&got);  // never blocks; the join may have come with the handshake's end
        if (got.empty()) {
          if (!open) fail(ecclRemoteError, "{}: closed before its first message", u.what);
          if (Clock::now() >= u.deadline)
            fail(ecclTimeout, "{}: no first message within {} ms of the handshake", u.what, s.opt.handshakeTimeoutMs);
          waiting.push_back(std::move(u));
          continue;
        }
        CoordMessage join = std::move(got.front());
        if (join.kind != CoordKind::kJoin && join.kind != CoordKind::kStatusQuery && join.kind != CoordKind::kMigrate)
          fail(ecclRemoteError, "{}: first message is {}, expected join", u.what, coordKindName(join.kind));
        if (join.kind != CoordKind::kJoin) join.role = Role::kTool;
        SealedChannel* channel = u.channel.get();
        s.onJoin(std::move(u.channel), join);
        for (auto& [mid, m] : s.members)
          if (m.channel.get() == channel)
            for (size_t k = 1; k < got.size(); ++k) s.onMessage(mid, got[k]);
      } catch (const Error& e) {
        log::warn("coordinator rejected {}", e.what());
      }
    }
    unjoined = std::move(waiting);
  };
  auto nextBeat = Clock::now();
  while (!stopping_) {
    std::vector<pollfd> fds;
    std::vector<uint64_t> owners;
    for (auto& [mid, m] : s.members)
      if (m.channel) fds.push_back({m.channel->fd(), POLLIN, 0}), owners.push_back(mid);
    size_t unjoinedAt = fds.size();
    for (auto& u : unjoined) fds.push_back({u.channel->fd(), POLLIN, 0});
    size_t gateAt = fds.size();
    gate.pollSet(&fds);
    int wait = gate.msUntilNextDeadline(static_cast<int>(std::clamp<int64_t>(msUntil(nextBeat), 0, 100)));
    int n = ::poll(fds.data(), fds.size(), wait);
    if (n < 0 && errno != EINTR) fail(ecclSystemError, "coordinator poll(): {}", strerror(errno));
    if (n < 0)
      for (auto& f : fds) f.revents = 0;
    // Joins first: a member's join was sent before anyone could learn of
    // it, so it must be handled before the messages of members that name
    // it (a reconfiguration that lists a new standby).
    std::vector<Admitted> admitted;
    gate.service(fds.data() + gateAt, fds.size() - gateAt, &admitted);
    for (Admitted& a : admitted)
      unjoined.push_back({std::make_unique<SealedChannel>(std::move(a.fd), a.sessionKey, true, a.from),
                          deadlineAfterMs(s.opt.handshakeTimeoutMs),
                          fmt::format("coordinator, connection from {}", a.from)});
    serveUnjoined(unjoined);
    for (size_t i = 0; n > 0 && i < unjoinedAt; ++i) {
      if (!fds[i].revents) continue;
      auto it = s.members.find(owners[i]);
      if (it == s.members.end() || !it->second.channel) continue;
      std::vector<CoordMessage> got;
      bool open = true;
      std::string error;
      try {
        open = it->second.channel->drain(&got);
      } catch (const Error& e) {
        error = e.what();
      }
      uint64_t mid = owners[i];
      for (auto& msg : got) {
        // A bug in handling one message must not take the job's only
        // coordinator down with it: the message is dropped, loudly.
        try {
          s.onMessage(mid, msg);
        } catch (const std::exception& e) {
          log::warn("coordinator: internal error handling a {} message from member {:016x} (dropped): {}",
                    coordKindName(msg.kind), mid, e.what());
        }
      }
      it = s.members.find(mid);
      if (it == s.members.end()) continue;
      if (!error.empty()) {
        s.declareFailed(mid, error);
      } else if (!open) {
        if (it->second.left) {
          bool needed = s.pending && !std::count(s.pending->leavers.begin(), s.pending->leavers.end(), mid) &&
                        (s.isJoiner(mid) ||
                         std::count(s.pending->next.begin(), s.pending->next.end(), mid));
          std::string why = fmt::format("{} left the job during the reconfiguration", s.label(mid));
          bool voting = needed && s.pending->voting;
          bool pendingLeaver = s.pending && std::count(s.pending->leavers.begin(), s.pending->leavers.end(), mid);
          if (voting) s.noteLossDuringVote(mid, why);
          else if (needed) s.abortPending(why);
          s.refuseReconfigurationsNaming(mid, why);
          it = s.members.find(mid);
          if (s.view.empty()) s.rankOf.erase(mid);
          // A member of the view that left in order still leaves its rank
          // empty: the others' recovery must replace or drop it. It counts
          // as failed for that, silently: nobody is told (its goodbyes have
          // told its peers, and a notice could overtake them and fail
          // their last ops).
          bool departed = s.inView(mid) && !s.isFailed(mid) && !voting && !pendingLeaver;
          if (departed) {
            s.failed.push_back(mid);
            s.lastFailure = fmt::format("{} left the job (it destroyed its communicator)", s.label(mid));
          }
          s.members.erase(it);
          if (voting) s.decideVote();
          if (departed) s.tryRecover();
        } else {
          s.declareFailed(mid, "its connection to the coordinator closed (process exited or was killed)");
        }
      }
    }
    // This thread may live until the process exits (ecclGetUniqueId): keep
    // no OpenSSL per-thread state between rounds, so nothing is left behind.
    releaseThreadCryptoState();
    {
      std::set<uint64_t> idle;
      for (auto& [mid, m] : s.members)
        if (m.role == Role::kStandby && !m.reserved) idle.insert(m.pid);
      std::set<uint64_t> inView;
      for (uint64_t mid : s.view)
        if (s.members.count(mid)) inView.insert(s.members.at(mid).pid);
      MutexLock lock(snapshotMu_);
      idleStandbyPids_ = std::move(idle);
      viewPids_ = std::move(inView);
    }
    if (s.replaceHeldUntil && Clock::now() >= *s.replaceHeldUntil) s.tryRecover();  // refuses it
    if (Clock::now() >= nextBeat) {
      nextBeat = Clock::now() + std::chrono::milliseconds(s.opt.heartbeatMs);
      CoordMessage beat;
      beat.kind = CoordKind::kHeartbeat;
      beat.epoch = s.epoch;
      std::vector<uint64_t> silent;
      auto limit = std::chrono::milliseconds(s.opt.heartbeatTimeoutMs);
      for (auto& [mid, m] : s.members) {
        if (!m.channel) continue;
        if (Clock::now() - m.lastHeard > limit) silent.push_back(mid);
        else s.send(m, beat);
      }
      for (uint64_t mid : silent)
        s.declareFailed(mid, fmt::format("no heartbeat for {} ms (stopped or hung process?)", s.opt.heartbeatTimeoutMs));
    }
  }
}

std::unique_ptr<Coordinator> createJob(ecclUniqueId* id) {
  UniqueIdData d;
  randomBytes(d.secret.data(), d.secret.size());
  randomBytes(&d.jobId, sizeof(d.jobId));
  NetInterface ni = pickInterface(params::socketIfname());
  auto [fd, bound] = listenOn(ni.addr);
  d.root = bound;
  *id = encodeUniqueId(d);
  return std::make_unique<Coordinator>(d, std::move(fd), coordinatorOptionsFromEnv());
}

ecclUniqueId createUniqueId() {
  static Mutex mu;
  static std::vector<std::unique_ptr<Coordinator>> kept;
  ecclUniqueId id;
  auto c = createJob(&id);
  MutexLock lock(mu);
  kept.push_back(std::move(c));
  return id;
}

CoordinatorOptions coordinatorOptionsFromEnv() {
  CoordinatorOptions o;
  o.heartbeatMs = params::heartbeatMs();
  o.heartbeatTimeoutMs = params::heartbeatTimeoutMs();
  o.handshakeTimeoutMs = params::handshakeTimeoutMs();
  o.maxUnauthenticated = static_cast<size_t>(params::maxUnauthenticated());
  o.replaceWaitMs = params::replaceWaitMs();
  return o;
}

namespace {

std::string toolRequest(const UniqueIdData& id, CoordMessage q, Deadline deadline, const std::string& what) {
  Fd fd = connectTo(id.root, deadline, what);
  Hello hello{Purpose::kBootstrap, id.jobId, 0, 0, 0};
  Secret key;
  authenticateAsClient(fd.get(), id.secret, hello, deadline, what, &key);
  SealedChannel ch(std::move(fd), key, false, "the coordinator");
  q.role = Role::kTool;
  ch.send(q, deadline);
  CoordMessage answer = ch.receive(deadline);
  if (answer.kind == CoordKind::kError) fail(ecclInvalidUsage, "{}: refused: {}", what, answer.text);
  if (answer.kind != CoordKind::kStatus) fail(ecclRemoteError, "{}: answered with {}", what, coordKindName(answer.kind));
  return answer.text;
}

}  // namespace

std::string queryCoordinatorStatus(const UniqueIdData& id, Deadline deadline) {
  CoordMessage q;
  q.kind = CoordKind::kStatusQuery;
  return toolRequest(id, q, deadline, fmt::format("status query to the coordinator at {}", id.root.str()));
}

std::string requestMigration(const UniqueIdData& id, int rank, Deadline deadline) {
  CoordMessage q;
  q.kind = CoordKind::kMigrate;
  q.rank = rank;
  return toolRequest(id, q, deadline, fmt::format("migration of rank {} via the coordinator at {}", rank, id.root.str()));
}

}  // namespace eccl::membership
