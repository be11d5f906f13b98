// The coordinator's decisions, without sockets, threads or a clock of its
// own: a pure state machine. Its driver (coordinator.cc) owns the
// connections, authenticates them and keeps the time; it feeds the core
// one input at a time (a connection's first message, a member's message, a
// closed connection, the time) and carries out the actions each input
// leaves behind (messages to send, connections to close). Nothing here
// blocks, so the same inputs on a fake clock replay any race exactly
// (tests/unit/coordinator_core_test.cc).
//
// One file per protocol, each defining its part of the class:
//   admission.cc    joins, formation, standby lists, tools' requests
//   liveness.cc     heartbeats, silence, closed connections, failures, watched groups
//   recovery.cc     REPLACE / SHRINK (and the wait for standbys), grow
//   vote.cc         expected migration: prepare, the in-band switchover vote
//   reconfigure.cc  memberships named outright (c10d's reconfigure)
//   status.cc       what `ecclcoord status` prints
//   persistence.cc  the durable state, for a replica to take over
// and core.cc: the inputs, the output and the lookups they share.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <array>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "membership/coord_messages.h"
#include "membership/coordinator.h"

namespace eccl::membership {

// What the core asks of its driver, in order. Connections are named by the
// driver's ids (never 0).
struct CoordAction {
  enum class Kind { kSend, kSendAndClose, kClose };
  Kind kind = Kind::kSend;
  uint64_t conn = 0;
  // One object for every action of a broadcast, so the driver encodes and
  // hashes it once however many members it goes to.
  std::shared_ptr<const CoordMessage> message;
  // The peer is most likely dead: a failure to deliver is expected, so the
  // driver tries briefly and says nothing.
  bool quiet = false;
};

class CoordinatorCore {
 public:
  using Time = Clock::time_point;
  explicit CoordinatorCore(const CoordinatorOptions& options) : opt(options) {}

  // Inputs. `now` never goes backwards.
  // An authenticated connection's first message: a join, a status query or
  // a migration request (both from a tool, answered and closed).
  void onFirstMessage(uint64_t conn, const std::string& peer, CoordMessage first, Time now);
  // A message from the member that joined on `conn`.
  void onMessage(uint64_t conn, const CoordMessage& msg, Time now);
  // `conn` reached its end of file (error empty) or broke (error says how).
  void onClosed(uint64_t conn, const std::string& error, Time now);
  // A send to `conn` failed: it is broken, and its end of file or silence
  // will declare its member; nothing more is sent to it meanwhile.
  void onUnreachable(uint64_t conn);
  // Time passes: heartbeats go out, silent members are declared, a held
  // REPLACE runs out.
  void onTick(Time now);

  // The job's durable state, for a replica to take over from (persistence.cc):
  // members (ids, roles, addresses, recovery asks), fences, the view, its
  // epoch and the highest epoch announced, watched groups, named
  // memberships asked and used, and a migration being prepared (who is
  // prepared, whether READY went out, the votes heard). Not in it:
  // connections and heartbeat times.
  CoordinatorState exportState() const;
  // Takes over from `state` (exportState's) before any input. Every member
  // is known and unconnected: a join naming its id re-attaches it with its
  // rank; one that is not back within heartbeatTimeoutMs is declared
  // failed. Throws naming what is malformed.
  void importState(const CoordinatorState& state, Time now);
  // Whether the durable state may have changed since the last call: the
  // driver writes it (replicated) before carrying out the actions that
  // announce it.
  bool takeStateChanged() { return std::exchange(stateChanged, false); }

  // When onTick must run next.
  Time nextWake() const;
  std::vector<CoordAction> takeActions() { return std::exchange(actions, {}); }

  // Read-only views for the driver and tools.
  std::set<uint64_t> idleStandbyPids() const;
  std::set<uint64_t> viewPids() const;
  const std::set<uint64_t>& fencedPids() const { return fencedPids_; }
  // Changes whenever those pid sets may have (a new epoch, a member come or
  // gone, standbys reserved or released), so they are not rebuilt per round.
  std::tuple<uint32_t, size_t, bool, size_t> pidsKey() const {
    return {epoch, members.size(), anyReserved, fencedPids_.size()};
  }
  std::string statusText() const;
  std::vector<uint64_t> currentView() const { return view; }
  uint32_t currentEpoch() const { return epoch; }

 private:
  struct Member {
    uint64_t id = 0;
    Role role = Role::kRank;
    std::string address;
    uint64_t pid = 0;
    uint64_t joinOrder = 0;
    uint64_t conn = 0;  // 0: its connection is closed
    Time lastHeard;
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
    // Known from the state of the coordinator this one took over from, and
    // not reconnected yet.
    bool restored = false;
    // The epoch of the last view sent on its connection (0: none): a member
    // that holds the view before the current one is sent the changes.
    uint32_t viewHeld = 0;
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
    std::string firstLoss;          // the first death (else failed vote): the reason of an abort
    bool firstLossIsDeath = false;
    std::string story;
  };

  struct ReconfigureAsk {
    uint64_t uuid = 0;
    std::vector<uint64_t> members;
  };

  // Output.
  void send(Member& m, const CoordMessage& msg);
  void send(Member& m, const std::shared_ptr<const CoordMessage>& msg);
  void sendTo(uint64_t conn, const CoordMessage& msg, CoordAction::Kind kind, bool quiet = false);
  void closeConnection(Member& m);
  void eraseMember(uint64_t member);
  void sendView(uint64_t member, const std::string& why);
  // Every change of the view goes through here (the previous view's
  // entries are kept for the deltas sent to the members that hold it).
  void replaceView(std::vector<uint64_t> next);
  void sendError(uint64_t member, const std::string& text);

  // Lookups.
  std::string label(uint64_t member) const;
  // The current view's entries, encoded once per epoch (every view change
  // takes a new epoch, and a member's address never changes while it is in
  // a view; eraseMember drops the copy): a broadcast to thousands shares
  // one copy.
  std::shared_ptr<const EncodedEntries> entries() const;
  bool inView(uint64_t member) const;
  bool isFailed(uint64_t member) const;
  bool usableStandby(const Member& m) const;
  bool idleStandby(const Member& m) const { return usableStandby(m) && !m.reserved; }
  std::vector<uint64_t> idleStandbys(bool withReserved = false) const;
  bool isJoiner(uint64_t m) const;
  std::vector<uint64_t> pendingParticipants() const;
  bool notRegisteredYet(uint64_t m) const;
  std::string unfitForReconfiguration(uint64_t m) const;
  std::optional<std::vector<uint64_t>> everyoneAsked(Member::Ask ask);
  static std::string describeMembers(const std::vector<uint64_t>& list);

  // Admission (admission.cc).
  void join(uint64_t conn, const std::string& peer, const CoordMessage& msg);
  void resume(uint64_t conn, uint64_t member, uint32_t itsEpoch);
  void answerTool(uint64_t conn, const std::string& peer, const CoordMessage& msg);
  std::string vacateRank(int64_t rank, const std::string& how, const std::string& asker);
  void fillVacantRanks();
  void form();
  void sendStandbys();
  void announceViewToStandbys();

  // Liveness and failures (liveness.cc).
  void dispatch(uint64_t from, const CoordMessage& msg);
  void declareFailed(uint64_t member, const std::string& reason, uint64_t neededFrom = 0);
  void departed(uint64_t member);
  CoordMessage failedNotice(std::string text) const;
  void breakGroupsOf(uint64_t member, const std::string& why);
  void tellGroupBroken(uint64_t to, uint64_t uuid, uint64_t failedMember, const std::string& why);
  void onGroup(uint64_t from, const CoordMessage& msg);
  void heartbeat(int slice);
  void holdOrDeclare(uint64_t from, uint64_t accused, const CoordMessage& report, size_t index);
  void settleHeldReports();

  // Recovery (recovery.cc).
  void onRecover(uint64_t from, const CoordMessage& msg);
  void onGrow(uint64_t from, const CoordMessage& msg);
  void tryRecover();
  void releaseReservations();
  // quiet: an answer the askers poll for (a grow before any standby came),
  // logged at INFO rather than as a warning.
  void refuseAll(const std::vector<uint64_t>& waiting, const std::string& what, const std::string& why,
                 bool quiet = false);
  void commitView(std::vector<uint64_t> next, const std::vector<uint64_t>& promoted, const std::string& story,
                  const std::vector<uint64_t>& leavers, uint64_t uuid = 0);
  // A rank of the view failed or left: the grow asked so far can never
  // gather every rank, and its askers must recover with the others.
  void refuseGrowAsks(const std::string& why);

  // Expected migration and its vote (vote.cc).
  std::string startMigration(int64_t rank, const std::string& asker);
  CoordMessage prepareAnnouncement() const;  // the PREPARE of `pending`
  void reannouncePending(uint64_t member);
  void abortPending(const std::string& why);
  void onPrepared(uint64_t from, const CoordMessage& msg);
  void onSwitchover(uint64_t from, const CoordMessage& msg);
  void onVote(uint64_t from, const CoordMessage& msg);
  void noteLossDuringVote(uint64_t member, const std::string& why);
  void decideVote();
  void commitVote();

  // Named memberships (reconfigure.cc).
  void onReconfigure(uint64_t from, const CoordMessage& msg);
  void refuseReconfiguration(uint64_t uuid, const std::string& why);
  void refuseReconfigurationsNaming(uint64_t member, const std::string& why);
  void commitReconfiguration(uint64_t uuid, const std::vector<uint64_t>& next);

  CoordinatorOptions opt;
  Time now{};
  // Heartbeats go out (and silence is checked) in slices of the members
  // spread over the period, each slice when its time comes: all at once,
  // a round at thousands of members held the loop for over 100 ms, and a
  // failure notice waited behind it.
  static constexpr int kBeatSlices = 8;
  std::array<Time, kBeatSlices> sliceDue{};
  bool started = false;  // sliceDue is set
  bool stateChanged = false;
  std::vector<CoordAction> actions;
  std::map<uint64_t, uint64_t> memberOfConn;  // conn -> member, while both live
  std::map<uint64_t, Member> members;
  std::set<uint64_t> fenced;
  // The processes of fenced members: a launcher kills those still alive
  // (a hung one never exits on its own) and may start their repair.
  std::set<uint64_t> fencedPids_;
  std::set<uint64_t> gone;  // registered once, gone since (a failed member is fenced instead)
  uint64_t joins = 0;
  uint32_t nranks = 0;
  uint32_t epoch = 0;
  uint32_t issued = 0;             // highest epoch ever announced: an aborted vote's number is never reused
  std::map<uint64_t, int64_t> rankOf;  // requested ranks before formation
  // Before formation: ranks whose process ended before it registered, with
  // how (a launcher's kRankExited); the next idle standby takes each.
  std::map<int64_t, std::string> vacantRanks;
  std::vector<uint64_t> view;      // rank -> member; empty until formed
  std::vector<uint64_t> failed;    // members of `view` failed in this epoch
  // Those of `failed` that left in order, reported by a member whose
  // collective of this sequence number needed them (CoordMessage::neededFrom).
  std::map<uint64_t, uint64_t> failedNeededFrom;
  // Watched groups (kGroup): uuid -> members; and why each broken one broke.
  std::map<uint64_t, std::set<uint64_t>> groups;
  std::map<uint64_t, std::pair<uint64_t, std::string>> brokenGroups;  // uuid -> (failed member, why)
  std::string lastFailure;
  bool eagerListSent = false;  // the last standby list sent named someone
  std::optional<Pending> pending;
  std::string lastAbort;
  // A REPLACE short of standbys, held (opt.replaceWaitMs) until this time.
  std::optional<Time> replaceHeldUntil;
  // Reports that the accused closed its lanes on the reporter while the
  // accused is still connected here: held for opt.closedReportGraceMs,
  // since a live member closes the lanes of one it judged failed (one that
  // stalled past its deadline, came back and saw the close). If the
  // accused reports the reporter meanwhile, the reporter is the failed one
  // and its report is dropped. Not durable: a successor hears it again.
  struct HeldReport {
    uint64_t from = 0, accused = 0;
    uint32_t epoch = 0;
    uint64_t neededFrom = 0;
    std::string text;
    Time until{};
  };
  std::vector<HeldReport> heldReports;
  // Memberships named outright (kReconfigure), by asker; each uuid names
  // one view at most, ever.
  std::map<uint64_t, ReconfigureAsk> reconfigureAsks;
  std::map<uint64_t, uint32_t> usedUuids;        // uuid -> the epoch it made
  std::map<uint64_t, std::string> refusedUuids;  // uuid -> why: a late caller hears the same
  uint64_t viewUuid = 0;                         // the uuid that made the current view (0: another cause)
  mutable std::shared_ptr<const EncodedEntries> entriesOfEpoch;  // entries(), for epoch entriesEpoch
  mutable uint32_t entriesEpoch = 0;
  // The view before the current one, and what changed since (computed once
  // per epoch): a member holding it gets only the changes.
  std::vector<ViewEntry> previousEntries;
  uint32_t previousEpoch = 0;
  struct Changes {
    uint32_t epoch = 0;
    bool worthIt = false;  // few enough to send as changes
    std::vector<uint64_t> ranks;
    std::vector<ViewEntry> entries;
    uint64_t checksum = 0;
  };
  mutable std::optional<Changes> changes;
  size_t askHint = 0;        // everyoneAsked() looks here first
  bool anyReserved = false;  // some standby is reserved for a held REPLACE
  const Changes& changesSincePrevious() const;
};

}  // namespace eccl::membership
