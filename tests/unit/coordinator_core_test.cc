// The coordinator's state machine on a fake clock: each protocol and its
// races, input by input, with what it sends checked exactly. No sockets,
// no threads, no sleeping.
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <algorithm>
#include <map>

#include "common/error.h"
#include "membership/coordinator/core.h"

namespace eccl::membership {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

class Harness {
 public:
  explicit Harness(CoordinatorOptions opt = {}) : core(opt) { core.onTick(now); }

  // Members are named 1, 2, ...; each joins on a connection of the same number.
  void joinRank(uint64_t member, int64_t rank, uint32_t nranks) { first(member, join(member, Role::kRank, rank, nranks)); }
  void joinStandby(uint64_t member, bool eager = false) {
    CoordMessage j = join(member, Role::kStandby, -1, 0);
    j.policy = eager ? 1 : 0;
    first(member, j);
  }
  // A member an earlier coordinator admitted comes back, in view `epoch`.
  void resume(uint64_t member, Role role, uint32_t epoch) {
    CoordMessage j = join(member, role, -1, 0);
    j.uuid = kJoinResuming;
    j.epoch = epoch;
    first(member, j);
  }
  void first(uint64_t conn, const CoordMessage& m) {
    core.onFirstMessage(conn, "test", m, now);
    collect();
  }
  void say(uint64_t member, CoordMessage m) {
    core.onMessage(member, m, now);
    collect();
  }
  void say(uint64_t member, CoordKind kind, uint32_t epoch = 0, uint32_t policy = 0) {
    CoordMessage m;
    m.kind = kind;
    m.epoch = epoch;
    m.policy = policy;
    say(member, m);
  }
  void closed(uint64_t member, const std::string& error = "") {
    core.onClosed(member, error, now);
    collect();
  }
  // Time passes in heartbeat steps; `beating` members send theirs each step.
  void advance(std::chrono::milliseconds by, const std::vector<uint64_t>& beating) {
    const auto until = now + by;
    while (now < until) {
      now = std::min(until, now + 250ms);
      for (uint64_t m : beating) core.onMessage(m, heartbeatMsg(), now);
      core.onTick(now);
      collect();
    }
  }

  // What went to `conn` since the last clear(), of one kind.
  std::vector<CoordMessage> to(uint64_t conn, CoordKind kind) const {
    std::vector<CoordMessage> out;
    for (const CoordAction& a : actions)
      if (a.conn == conn && a.kind != CoordAction::Kind::kClose && a.message->kind == kind) out.push_back(*a.message);
    return out;
  }
  bool closedBy(uint64_t conn) const {
    return std::any_of(actions.begin(), actions.end(),
                       [&](const CoordAction& a) { return a.conn == conn && a.kind != CoordAction::Kind::kSend; });
  }
  size_t sentOfKind(CoordKind kind) const {
    return std::count_if(actions.begin(), actions.end(),
                         [&](const CoordAction& a) { return a.kind != CoordAction::Kind::kClose && a.message->kind == kind; });
  }
  void clear() { actions.clear(); }

  CoordinatorCore core;
  CoordinatorCore::Time now = CoordinatorCore::Time{} + 1h;
  std::vector<CoordAction> actions;
  std::map<uint64_t, HeldView> held;  // by connection
  size_t deltaViews = 0;              // views that came as changes

 private:
  static CoordMessage join(uint64_t member, Role role, int64_t rank, uint32_t nranks) {
    CoordMessage j;
    j.kind = CoordKind::kJoin;
    j.role = role;
    j.rank = rank;
    j.nranks = nranks;
    j.member = member;
    j.pid = 1000 + member;
    j.address = "tcp:10.0.0." + std::to_string(member) + ":1";
    return j;
  }
  static CoordMessage heartbeatMsg() {
    CoordMessage h;
    h.kind = CoordKind::kHeartbeat;
    return h;
  }
  // Views sent as changes are made whole against what each connection was
  // sent before, as the member's client does, so tests read whole views.
  void collect() {
    auto got = core.takeActions();
    for (CoordAction& a : got) {
      if (a.kind == CoordAction::Kind::kClose || a.message->kind != CoordKind::kView) continue;
      CoordMessage whole = *a.message;
      if (whole.encoded) whole.entries = whole.encoded->entries, whole.encoded.reset();
      deltaViews += whole.policy == kViewDelta;
      std::string why;
      if (!takeView(&held[a.conn], &whole, &why)) ADD_FAILURE() << "view to " << a.conn << ": " << why;
      a.message = std::make_shared<const CoordMessage>(std::move(whole));
    }
    actions.insert(actions.end(), got.begin(), got.end());
  }
};

std::vector<uint64_t> membersOf(const CoordMessage& view) {
  std::vector<uint64_t> out;
  for (const ViewEntry& e : view.viewEntries()) out.push_back(e.member);
  return out;
}

// Three ranks formed (members 1..3 at ranks 0..2), actions cleared.
void formThree(Harness& h) {
  h.joinRank(1, 0, 3);
  h.joinRank(2, 1, 3);
  h.joinRank(3, 2, 3);
  h.clear();
}

// The survivors `who` ask to recover at epoch 1 with `policy`.
void recover(Harness& h, std::vector<uint64_t> who, RecoverPolicy policy) {
  for (uint64_t m : who) h.say(m, CoordKind::kRecover, 1, static_cast<uint32_t>(policy));
}

// Rank 2 (member 3) dies; the survivors ask for a REPLACE that must wait
// (replaceWaitMs 2000) for a standby.
void holdReplace(Harness& h) {
  formThree(h);
  h.closed(3);
  recover(h, {1, 2}, RecoverPolicy::kReplace);
}

TEST(CoordinatorAdmission, FormsOnceEveryRankRegisteredInAnyOrder) {
  Harness h;
  h.joinRank(3, 2, 3);
  h.joinRank(1, 0, 3);
  EXPECT_EQ(h.sentOfKind(CoordKind::kView), 0u);
  h.joinRank(2, 1, 3);
  for (uint64_t m : {1, 2, 3}) {
    auto views = h.to(m, CoordKind::kView);
    ASSERT_EQ(views.size(), 1u) << "member " << m;
    EXPECT_EQ(views[0].epoch, 1u);
    EXPECT_EQ(views[0].rank, static_cast<int64_t>(m - 1));
    EXPECT_EQ(membersOf(views[0]), (std::vector<uint64_t>{1, 2, 3}));
  }
  EXPECT_EQ(h.core.currentEpoch(), 1u);
}

TEST(CoordinatorAdmission, RefusesWhatDisagreesWithTheJobAndNamesWhy) {
  Harness h;
  h.joinRank(1, 0, 2);
  auto refused = [&](uint64_t conn, const std::string& part) {
    auto errors = h.to(conn, CoordKind::kError);
    ASSERT_EQ(errors.size(), 1u) << part;
    EXPECT_NE(errors[0].text.find(part), std::string::npos) << errors[0].text;
    EXPECT_TRUE(h.closedBy(conn));
  };
  h.joinRank(2, 0, 2);
  refused(2, "rank 0 registered twice");
  h.joinRank(3, 1, 4);
  refused(3, "says nranks=4");
  h.joinRank(4, 5, 2);
  refused(4, "outside [0, 2)");
  h.first(5, [] {
    CoordMessage j;
    j.kind = CoordKind::kJoin;
    j.role = Role::kStandby;
    j.member = 1;  // member 1's id on another connection
    return j;
  }());
  refused(5, "already in use");
  h.joinRank(6, 1, 2);
  EXPECT_EQ(h.to(6, CoordKind::kView).size(), 1u);  // the refusals cost the job nothing
  h.joinRank(7, 1, 2);
  refused(7, "already formed");
}

TEST(CoordinatorAdmission, ToolIsAnsweredWithTheStatusAndClosed) {
  Harness h;
  h.joinRank(1, 0, 2);
  CoordMessage q;
  q.kind = CoordKind::kStatusQuery;
  h.first(9, q);
  auto status = h.to(9, CoordKind::kStatus);
  ASSERT_EQ(status.size(), 1u);
  EXPECT_NE(status[0].text.find("forming: 1 of 2 ranks registered (missing: 1)"), std::string::npos) << status[0].text;
  EXPECT_TRUE(h.closedBy(9));
}

// A launcher says rank 1's process ended before it registered: the next
// idle standby takes the rank and the job forms without waiting for it.
TEST(CoordinatorAdmission, ARankThatEndedBeforeRegisteringGoesToAStandby) {
  Harness h;
  h.joinRank(1, 0, 3);
  h.joinRank(3, 2, 3);
  auto exited = [&](uint64_t conn, int64_t rank) {
    CoordMessage m;
    m.kind = CoordKind::kRankExited;
    m.rank = rank;
    m.text = "pid 77 exited with status 3";
    h.first(conn, m);
    EXPECT_TRUE(h.closedBy(conn));
  };
  exited(9, 1);
  auto status = h.to(9, CoordKind::kStatus);
  ASSERT_EQ(status.size(), 1u);
  EXPECT_NE(status[0].text.find("waiting for a standby: 1 (pid 77 exited with status 3)"), std::string::npos)
      << status[0].text;
  EXPECT_EQ(h.sentOfKind(CoordKind::kView), 0u);
  exited(10, 5);
  auto refused = h.to(10, CoordKind::kError);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].text.find("rank 5 is outside [0, 3)"), std::string::npos) << refused[0].text;
  exited(11, 0);  // it registered: its own connection's close will say if it ended
  EXPECT_EQ(h.to(11, CoordKind::kStatus).size(), 1u);
  h.joinStandby(4);
  for (uint64_t m : {1, 3, 4}) {
    auto views = h.to(m, CoordKind::kView);
    ASSERT_FALSE(views.empty()) << "member " << m;
    EXPECT_EQ(views.back().epoch, 1u);
    EXPECT_EQ(membersOf(views.back()), (std::vector<uint64_t>{1, 4, 3}));
  }
  EXPECT_EQ(h.to(4, CoordKind::kView).back().rank, 1);
  // A process registering as rank 1 late finds it taken.
  h.clear();
  h.joinRank(5, 1, 3);
  EXPECT_EQ(h.to(5, CoordKind::kError).size(), 1u);
}

TEST(CoordinatorLiveness, SilentMemberIsDeclaredFencedAndTheOthersTold) {
  Harness h;
  formThree(h);
  h.advance(2500ms, {1, 2, 3});
  EXPECT_EQ(h.sentOfKind(CoordKind::kFailed), 0u);
  EXPECT_GE(h.to(3, CoordKind::kHeartbeat).size(), 4u);  // every 500 ms
  h.clear();
  h.advance(3500ms, {1, 2});
  auto evicted = h.to(3, CoordKind::kEvicted);
  ASSERT_EQ(evicted.size(), 1u);
  EXPECT_NE(evicted[0].text.find("no heartbeat for 3000 ms"), std::string::npos) << evicted[0].text;
  EXPECT_TRUE(h.closedBy(3));
  for (uint64_t m : {1, 2}) {
    auto failed = h.to(m, CoordKind::kFailed);
    ASSERT_EQ(failed.size(), 1u);
    EXPECT_EQ(failed[0].members, std::vector<uint64_t>{3});
  }
  h.clear();
  h.joinStandby(3);  // it wakes up and tries again
  EXPECT_EQ(h.to(3, CoordKind::kEvicted).size(), 1u);
  EXPECT_NE(h.core.statusText().find("rank 2: member 0000000000000003 FAILED"), std::string::npos);
  // A launcher reading the status gets the pids the core holds.
  h.joinStandby(8);
  ASSERT_EQ(h.core.idleStandbyPids().size(), 1u);
  StatusPids pids = parseStatusPids(h.core.statusText());
  EXPECT_EQ(pids.view, h.core.viewPids());
  EXPECT_EQ(pids.idleStandbys, h.core.idleStandbyPids());
}

TEST(CoordinatorLiveness, TwoFailuresInOneTickAreOneRecovery) {
  Harness h;
  for (uint64_t m = 1; m <= 4; ++m) h.joinRank(m, static_cast<int64_t>(m - 1), 4);
  h.joinStandby(10);
  h.joinStandby(11);
  h.clear();
  h.advance(3500ms, {1, 2, 10, 11});  // 3 and 4 fall silent together
  ASSERT_EQ(h.to(3, CoordKind::kEvicted).size(), 1u);
  ASSERT_EQ(h.to(4, CoordKind::kEvicted).size(), 1u);
  auto notices = h.to(1, CoordKind::kFailed);
  ASSERT_EQ(notices.size(), 2u);
  EXPECT_EQ(notices[1].members, (std::vector<uint64_t>{3, 4}));
  h.clear();
  recover(h, {1}, RecoverPolicy::kReplace);
  EXPECT_EQ(h.sentOfKind(CoordKind::kView), 0u);  // rank 1 has not asked yet
  recover(h, {2}, RecoverPolicy::kReplace);
  auto view = h.to(1, CoordKind::kView);
  ASSERT_EQ(view.size(), 1u);
  EXPECT_EQ(view[0].epoch, 2u);
  EXPECT_EQ(membersOf(view[0]), (std::vector<uint64_t>{1, 2, 10, 11}));
  EXPECT_EQ(h.to(11, CoordKind::kView).at(0).rank, 3);
}

TEST(CoordinatorLiveness, OrderlyLeaveEmptiesItsRankWithoutAFailureNotice) {
  Harness h;
  formThree(h);
  h.say(3, CoordKind::kLeave);
  h.closed(3);
  EXPECT_EQ(h.sentOfKind(CoordKind::kFailed), 0u);
  recover(h, {1, 2}, RecoverPolicy::kShrink);
  auto view = h.to(2, CoordKind::kView);
  ASSERT_EQ(view.size(), 1u);
  EXPECT_EQ(membersOf(view[0]), (std::vector<uint64_t>{1, 2}));
}

TEST(CoordinatorLiveness, ResetAfterGoodbyeIsStillAnOrderlyExit) {
  Harness h;
  formThree(h);
  h.say(3, CoordKind::kLeave);
  h.closed(3, "receive failed: Connection reset by peer");  // it exited with our heartbeats unread
  EXPECT_EQ(h.sentOfKind(CoordKind::kFailed), 0u);
  EXPECT_EQ(h.core.statusText().find("failed:"), std::string::npos) << h.core.statusText();
}

TEST(CoordinatorLiveness, UnreachableMemberIsSentNothingMoreUntilDeclared) {
  Harness h;
  formThree(h);
  h.core.onUnreachable(2);
  h.advance(1000ms, {1, 2, 3});
  EXPECT_TRUE(h.to(2, CoordKind::kHeartbeat).empty());
  EXPECT_FALSE(h.to(1, CoordKind::kHeartbeat).empty());
  h.closed(2, "receive failed: Connection reset by peer");
  EXPECT_EQ(h.to(1, CoordKind::kFailed).size(), 1u);
  EXPECT_TRUE(h.to(2, CoordKind::kEvicted).empty());  // it could not have read it
}

CoordMessage reportOf(uint64_t accused, uint32_t policy, const std::string& text) {
  CoordMessage r;
  r.kind = CoordKind::kReport;
  r.epoch = 1;
  r.members = {accused};
  r.policy = policy;
  r.text = text;
  return r;
}

// Rank 2 stalled past rank 0's deadline and came back to find rank 0's
// lanes closed: its report that rank 0 closed on it arrives first. Rank 0,
// still connected, reports rank 2 within the grace: only rank 2 fails.
TEST(CoordinatorLiveness, AClosedLaneReportWaitsForTheAccusedsOwnWord) {
  Harness h;
  formThree(h);
  h.say(3, reportOf(1, kReportPeerClosed, "peer rank 0 closed the connection (lane 0)"));
  EXPECT_EQ(h.sentOfKind(CoordKind::kFailed), 0u);
  h.advance(250ms, {1, 2, 3});
  h.say(1, reportOf(3, 0, "peer rank 2 did not send its data before the deadline"));
  auto failed = h.to(2, CoordKind::kFailed);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].members, std::vector<uint64_t>{3});
  h.clear();
  h.advance(2000ms, {1, 2});
  EXPECT_EQ(h.sentOfKind(CoordKind::kFailed), 0u);
  EXPECT_TRUE(h.to(1, CoordKind::kEvicted).empty());
  EXPECT_FALSE(h.closedBy(1));
}

// Nobody contradicts it: the closed-lane report stands once the grace is
// over, and a closed-lane report about a member whose own connection is
// already gone (a killed process) stands at once.
TEST(CoordinatorLiveness, AClosedLaneReportStandsWhenTheAccusedSaysNothing) {
  CoordinatorOptions opt;
  opt.closedReportGraceMs = 600;
  Harness h(opt);
  formThree(h);
  h.say(2, reportOf(3, kReportPeerClosed, "peer rank 2 closed the connection (lane 0)"));
  h.advance(500ms, {1, 2, 3});
  EXPECT_EQ(h.sentOfKind(CoordKind::kFailed), 0u);
  h.advance(250ms, {1, 2, 3});
  auto failed = h.to(1, CoordKind::kFailed);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].members, std::vector<uint64_t>{3});
  EXPECT_NE(failed[0].text.find("reported by rank 1"), std::string::npos) << failed[0].text;

  Harness killed;
  formThree(killed);
  killed.core.onUnreachable(3);
  killed.say(2, reportOf(3, kReportPeerClosed, "peer rank 2 closed the connection (lane 0)"));
  EXPECT_EQ(killed.to(1, CoordKind::kFailed).size(), 1u);
}

// A killed rank's peers see its lanes close and ask to recover before the
// coordinator has read its own connection's end: the asks wait for the
// held reports rather than hear "nothing to recover", and the shrink
// follows once the connection's end comes. Reports that come to nothing
// answer the asks as before.
TEST(CoordinatorLiveness, RecoveryAskedWhileAReportIsHeldWaitsForIt) {
  Harness h;
  formThree(h);
  h.say(1, reportOf(2, kReportPeerClosed, "peer rank 1 closed the connection (lane 1)"));
  h.say(3, reportOf(2, kReportPeerClosed, "peer rank 1 closed the connection (lane 1)"));
  recover(h, {1, 3}, RecoverPolicy::kShrink);
  EXPECT_EQ(h.sentOfKind(CoordKind::kView), 0u);
  EXPECT_EQ(h.sentOfKind(CoordKind::kError), 0u);
  h.closed(2);
  auto view = h.to(3, CoordKind::kView);
  ASSERT_EQ(view.size(), 1u);
  EXPECT_EQ(membersOf(view[0]), (std::vector<uint64_t>{1, 3}));

  Harness quiet;
  formThree(quiet);
  quiet.say(2, reportOf(1, kReportPeerClosed, "peer rank 0 closed the connection (lane 0)"));
  recover(quiet, {2}, RecoverPolicy::kShrink);
  quiet.say(1, reportOf(2, 0, "peer rank 1 did not send its data before the deadline"));  // rank 1 was the one
  recover(quiet, {1, 3}, RecoverPolicy::kShrink);
  auto shrunk = quiet.to(1, CoordKind::kView);
  ASSERT_EQ(shrunk.size(), 1u);
  EXPECT_EQ(membersOf(shrunk[0]), (std::vector<uint64_t>{1, 3}));
}

TEST(CoordinatorRecovery, StandbyRegisteringDuringAHeldReplaceCompletesIt) {
  CoordinatorOptions opt;
  opt.replaceWaitMs = 2000;
  Harness h(opt);
  holdReplace(h);
  EXPECT_EQ(h.sentOfKind(CoordKind::kView), 0u);
  EXPECT_EQ(h.sentOfKind(CoordKind::kError), 0u);
  EXPECT_NE(h.core.statusText().find("REPLACE held for 1 failed rank(s)"), std::string::npos);
  h.advance(1000ms, {1, 2});
  h.joinStandby(7);
  auto view = h.to(1, CoordKind::kView);
  ASSERT_EQ(view.size(), 1u);
  EXPECT_EQ(membersOf(view[0]), (std::vector<uint64_t>{1, 2, 7}));
}

// A REPLACE changes one entry of the view: members (and standbys) that hold
// the previous view are sent that entry and a checksum, not the whole view;
// a member that comes back to a new coordinator, or one that held no view,
// gets it whole.
TEST(CoordinatorRecovery, AReplaceSendsOnlyTheChangedEntryToThoseHoldingThePreviousView) {
  Harness h;
  for (uint64_t m = 1; m <= 8; ++m) h.joinRank(m, static_cast<int64_t>(m - 1), 8);
  h.joinStandby(9);
  h.joinStandby(10);
  EXPECT_EQ(h.deltaViews, 0u);  // formation and registration: whole views
  h.clear();
  h.closed(3);
  recover(h, {1, 2, 4, 5, 6, 7, 8}, RecoverPolicy::kReplace);
  const std::vector<uint64_t> replaced{1, 2, 9, 4, 5, 6, 7, 8};
  for (uint64_t m : {1, 2, 4, 8, 9}) {
    auto view = h.to(m, CoordKind::kView);
    ASSERT_EQ(view.size(), 1u) << m;
    EXPECT_EQ(membersOf(view[0]), replaced) << m;
    EXPECT_EQ(view[0].epoch, 2u);
  }
  EXPECT_EQ(h.to(9, CoordKind::kView)[0].rank, 2);
  EXPECT_EQ(h.to(10, CoordKind::kView)[0].rank, -1);
  EXPECT_EQ(h.deltaViews, 9u);  // seven survivors, the promoted standby and the idle one
  // What went on the wire to a survivor: one entry.
  Harness raw;
  for (uint64_t m = 1; m <= 8; ++m) raw.joinRank(m, static_cast<int64_t>(m - 1), 8);
  raw.joinStandby(9);
  raw.core.takeActions();
  raw.core.onClosed(3, "", raw.now);
  for (uint64_t m : {1, 2, 4, 5, 6, 7, 8}) {
    CoordMessage ask;
    ask.kind = CoordKind::kRecover;
    ask.epoch = 1;
    ask.policy = static_cast<uint32_t>(RecoverPolicy::kReplace);
    raw.core.onMessage(m, ask, raw.now);
  }
  size_t deltas = 0;
  for (const CoordAction& a : raw.core.takeActions()) {
    if (a.kind == CoordAction::Kind::kClose || a.message->kind != CoordKind::kView) continue;
    ASSERT_EQ(a.message->policy, kViewDelta) << a.conn;
    EXPECT_EQ(a.message->pid, 1u);
    EXPECT_EQ(a.message->members, (std::vector<uint64_t>{2}));
    ASSERT_EQ(a.message->entries.size(), 1u);
    EXPECT_EQ(a.message->entries[0].member, 9u);
    EXPECT_FALSE(a.message->encoded);
    ++deltas;
  }
  EXPECT_EQ(deltas, 8u);
  // A member resuming with the job's next coordinator gets the view whole.
  Harness successor;
  successor.core.importState(h.core.exportState(), successor.now);
  successor.resume(1, Role::kRank, 2);
  auto resumed = successor.to(1, CoordKind::kView);
  ASSERT_EQ(resumed.size(), 1u);
  EXPECT_EQ(membersOf(resumed[0]), replaced);
  EXPECT_EQ(successor.deltaViews, 0u);
}

TEST(CoordinatorRecovery, HeldReplaceIsRefusedWhenTheWaitRunsOut) {
  CoordinatorOptions opt;
  opt.replaceWaitMs = 2000;
  Harness h(opt);
  holdReplace(h);
  EXPECT_LE(h.core.nextWake(), h.now + 2000ms);
  h.advance(2250ms, {1, 2});
  for (uint64_t m : {1, 2}) {
    auto errors = h.to(m, CoordKind::kError);
    ASSERT_EQ(errors.size(), 1u);
    EXPECT_NE(errors[0].text.find("after waiting 2000 ms"), std::string::npos) << errors[0].text;
  }
}

TEST(CoordinatorRecovery, SurvivorsAskingForDifferentPoliciesAreRefused) {
  Harness h;
  formThree(h);
  h.closed(2);
  recover(h, {1}, RecoverPolicy::kReplace);
  recover(h, {3}, RecoverPolicy::kShrink);
  EXPECT_EQ(h.to(1, CoordKind::kError).size(), 1u);
  EXPECT_EQ(h.to(3, CoordKind::kError).size(), 1u);
  h.clear();
  recover(h, {1, 3}, RecoverPolicy::kReplaceOrShrink);
  EXPECT_EQ(membersOf(h.to(3, CoordKind::kView).at(0)), (std::vector<uint64_t>{1, 3}));
}

// Two ranks asked to grow, then the third died before it asked: the grow
// can never gather every rank, so the askers hear so at once (they waited
// for their deadline, and the recovery for them, before) and recover.
TEST(CoordinatorRecovery, ARankFailingBeforeEveryoneAskedToGrowRefusesTheAskers) {
  Harness h;
  formThree(h);
  h.joinStandby(9);
  h.clear();
  for (uint64_t m : {1, 2}) {
    CoordMessage grow;
    grow.kind = CoordKind::kGrow;
    grow.epoch = 1;
    grow.nranks = 1;
    h.say(m, grow);
  }
  EXPECT_TRUE(h.to(1, CoordKind::kError).empty());
  h.closed(3);
  for (uint64_t m : {1, 2}) {
    auto errors = h.to(m, CoordKind::kError);
    ASSERT_EQ(errors.size(), 1u) << "member " << m;
    EXPECT_THAT(errors[0].text, HasSubstr("grow refused"));
    EXPECT_THAT(errors[0].text, HasSubstr("recover first"));
    EXPECT_THAT(errors[0].text, HasSubstr("rank 2"));
  }
  h.clear();
  recover(h, {1, 2}, RecoverPolicy::kShrink);
  auto views = h.to(1, CoordKind::kView);
  ASSERT_EQ(views.size(), 1u);
  EXPECT_EQ(membersOf(views[0]), (std::vector<uint64_t>{1, 2}));
}

TEST(CoordinatorRecovery, StaleEpochIsRefused) {
  Harness h;
  formThree(h);
  h.closed(2);
  h.say(1, CoordKind::kRecover, 7, 0);
  auto errors = h.to(1, CoordKind::kError);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].text.find("the current epoch is 1"), std::string::npos);
}

// Rank 1 (member 2) is to migrate to standby 9: PREPARE for epoch 2 is out.
void announceMigration(Harness& h) {
  formThree(h);
  h.joinStandby(9);
  h.clear();
  CoordMessage m;
  m.kind = CoordKind::kMigrate;
  m.rank = 1;
  h.say(1, m);
}

// Rank 1 (member 2) migrates to standby 9; everyone of the next view is prepared.
void prepareMigration(Harness& h) {
  announceMigration(h);
  for (uint64_t id : {1, 2, 3, 9}) ASSERT_EQ(h.to(id, CoordKind::kPrepare).size(), 1u) << id;
  for (uint64_t id : {1, 9, 3}) h.say(id, CoordKind::kPrepared, 2);
  for (uint64_t id : {1, 2, 3, 9}) ASSERT_EQ(h.to(id, CoordKind::kPrepareReady).size(), 1u) << id;
  h.clear();
}

TEST(CoordinatorVote, MemberFailingDuringTheVoteDoesNotAbortAYes) {
  Harness h;
  prepareMigration(h);
  h.say(2, CoordKind::kSwitchover, 2);  // the leaver waits for the outcome
  h.closed(3);                          // rank 2 dies mid-vote
  auto joinerHeard = h.to(9, CoordKind::kFailed);
  ASSERT_EQ(joinerHeard.size(), 1u);  // joiners hear of no failure otherwise
  EXPECT_EQ(joinerHeard[0].members, std::vector<uint64_t>{3});
  EXPECT_EQ(h.core.currentEpoch(), 1u);  // undecided: someone may have seen yes
  h.say(1, CoordKind::kSwitched, 2);
  EXPECT_EQ(h.core.currentEpoch(), 2u);
  EXPECT_EQ(h.core.currentView(), (std::vector<uint64_t>{1, 9, 3}));
  ASSERT_EQ(h.to(2, CoordKind::kView).size(), 1u);
  EXPECT_EQ(h.to(2, CoordKind::kView)[0].rank, -1);  // the leaver has left
  auto failed = h.to(1, CoordKind::kFailed);
  ASSERT_FALSE(failed.empty());
  EXPECT_EQ(failed.back().members, std::vector<uint64_t>{3});  // still failed in the new view
}

// A member that switched over in band closes its lanes to the leaver, which
// may take that for its failure: the leaver's report, once the vote is on,
// fails nobody. A member of the view (or the joiner) reporting it still does.
TEST(CoordinatorVote, ALeaversReportDuringTheVoteFailsNobody) {
  Harness h;
  prepareMigration(h);
  h.say(2, CoordKind::kSwitchover, 2);
  CoordMessage report;
  report.kind = CoordKind::kReport;
  report.epoch = 1;
  report.members = {1};
  report.neededFrom = {0};
  report.text = "peer rank 0: send on lane 0 failed: Broken pipe";
  h.say(2, report);
  EXPECT_EQ(h.sentOfKind(CoordKind::kFailed), 0u);
  EXPECT_FALSE(h.closedBy(1));
  h.say(1, CoordKind::kSwitched, 2);
  EXPECT_EQ(h.core.currentEpoch(), 2u);
  EXPECT_EQ(h.core.currentView(), (std::vector<uint64_t>{1, 9, 3}));
  report.epoch = 2;
  report.members = {3};
  h.say(9, report);
  auto failed = h.to(1, CoordKind::kFailed);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].members, std::vector<uint64_t>{3});
}

// A slow leaver asks about its switchover only after the vote committed and
// a recovery moved the job on: it hears that it left, not "no such
// reconfiguration".
TEST(CoordinatorVote, ALeaverAskingAfterALaterRecoveryHearsItLeft) {
  Harness h;
  prepareMigration(h);
  h.say(1, CoordKind::kSwitched, 2);
  ASSERT_EQ(h.core.currentEpoch(), 2u);
  h.closed(3);
  h.joinStandby(10);
  for (uint64_t m : {1, 9}) h.say(m, CoordKind::kRecover, 2, static_cast<uint32_t>(RecoverPolicy::kReplace));
  ASSERT_EQ(h.core.currentEpoch(), 3u);
  h.clear();
  h.say(2, CoordKind::kSwitchover, 2);
  EXPECT_TRUE(h.to(2, CoordKind::kError).empty());
  auto views = h.to(2, CoordKind::kView);
  ASSERT_EQ(views.size(), 1u);
  EXPECT_EQ(views[0].rank, -1);
}

TEST(CoordinatorVote, EveryoneGivingUpAbortsAndRetiresTheJoiner) {
  Harness h;
  prepareMigration(h);
  for (uint64_t id : {1, 9, 3}) {
    CoordMessage no;
    no.kind = CoordKind::kSwitchFailed;
    no.epoch = 2;
    no.text = "timed out";
    h.say(id, no);
  }
  EXPECT_EQ(h.core.currentEpoch(), 1u);
  EXPECT_NE(h.core.statusText().find("retired"), std::string::npos);
  EXPECT_NE(h.core.statusText().find("was aborted"), std::string::npos);
  // The next migration cannot reuse the aborted epoch's number.
  h.joinStandby(10);
  CoordMessage m;
  m.kind = CoordKind::kMigrate;
  m.rank = 0;
  h.say(1, m);
  auto prepare = h.to(10, CoordKind::kPrepare);
  ASSERT_EQ(prepare.size(), 1u);
  EXPECT_EQ(prepare[0].epoch, 3u);
}

TEST(CoordinatorVote, VoteBeforeReadyIsRefused) {
  Harness h;
  announceMigration(h);
  h.clear();
  h.say(1, CoordKind::kSwitched, 2);
  auto errors = h.to(1, CoordKind::kError);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].text.find("before every member was prepared"), std::string::npos);
}

CoordMessage reconfigure(uint64_t uuid, uint32_t epoch, std::vector<uint64_t> members) {
  CoordMessage r;
  r.kind = CoordKind::kReconfigure;
  r.uuid = uuid;
  r.epoch = epoch;
  r.members = std::move(members);
  return r;
}

TEST(CoordinatorReconfigure, CommitsOnceEveryNamedMemberAskedAndLeavesTheRestStandbys) {
  Harness h;
  formThree(h);
  h.joinStandby(8);
  h.clear();
  const std::vector<uint64_t> next{8, 1, 2};
  h.say(1, reconfigure(0xabc, 1, next));
  h.say(2, reconfigure(0xabc, 1, next));
  EXPECT_EQ(h.sentOfKind(CoordKind::kView), 0u);
  h.say(8, reconfigure(0xabc, 0, next));
  EXPECT_EQ(h.core.currentView(), next);
  EXPECT_EQ(h.to(3, CoordKind::kView).at(0).rank, -1);  // left out: a standby now
  EXPECT_EQ(h.to(8, CoordKind::kView).at(0).uuid, 0xabcu);
  h.clear();
  h.say(1, reconfigure(0xabc, 2, next));  // a uuid makes one view, ever
  EXPECT_NE(h.to(1, CoordKind::kError).at(0).text.find("already made epoch 2"), std::string::npos);
}

TEST(CoordinatorReconfigure, CallersThatDisagreeAreAllRefused) {
  Harness h;
  formThree(h);
  h.say(1, reconfigure(0x77, 1, {1, 2}));
  h.say(2, reconfigure(0x77, 1, {2, 1}));
  for (uint64_t m : {1, 2}) {
    auto errors = h.to(m, CoordKind::kError);
    ASSERT_EQ(errors.size(), 1u);
    EXPECT_NE(errors[0].text.find("callers disagree"), std::string::npos) << errors[0].text;
  }
  h.clear();
  h.say(3, reconfigure(0x77, 1, {2, 1, 3}));  // a late caller hears the same
  EXPECT_NE(h.to(3, CoordKind::kError).at(0).text.find("callers disagree"), std::string::npos);
}

TEST(CoordinatorReconfigure, AMemberFailingWhileAskedRefusesTheAsk) {
  Harness h;
  formThree(h);
  h.say(1, reconfigure(0x55, 1, {1, 2}));
  h.closed(2);
  auto errors = h.to(1, CoordKind::kError);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].text.find("a member it names is gone"), std::string::npos) << errors[0].text;
}

TEST(CoordinatorWatchedGroups, AGroupMemberFailingBreaksTheGroupForLateComersToo) {
  Harness h;
  formThree(h);
  CoordMessage g;
  g.kind = CoordKind::kGroup;
  g.uuid = 42;
  h.say(1, g);
  h.say(2, g);
  h.closed(2);
  EXPECT_EQ(h.to(1, CoordKind::kGroupFailed).size(), 1u);
  h.say(3, g);  // registers after the failure
  auto late = h.to(3, CoordKind::kGroupFailed);
  ASSERT_EQ(late.size(), 1u);
  EXPECT_EQ(late[0].members, std::vector<uint64_t>{2});
}

TEST(CoordinatorTakeover, MembersKeepTheirIdsAndRanksAndARecoveryInProgressCompletes) {
  Harness a;
  formThree(a);
  a.joinStandby(9);
  a.closed(3);
  recover(a, {1}, RecoverPolicy::kReplace);  // rank 1 has asked, rank 0 not yet
  Harness b;
  b.core.importState(a.core.exportState(), b.now);
  for (uint64_t m : {1, 2}) b.resume(m, Role::kRank, 1);
  b.resume(9, Role::kStandby, 1);
  for (uint64_t m : {1, 2}) {
    auto view = b.to(m, CoordKind::kView);
    ASSERT_EQ(view.size(), 1u) << m;
    EXPECT_EQ(view[0].epoch, 1u);
    EXPECT_EQ(view[0].rank, static_cast<int64_t>(m - 1));
    auto failed = b.to(m, CoordKind::kFailed);
    ASSERT_EQ(failed.size(), 1u);
    EXPECT_EQ(failed[0].members, std::vector<uint64_t>{3});
  }
  EXPECT_EQ(b.sentOfKind(CoordKind::kError), 0u);
  b.clear();
  recover(b, {2}, RecoverPolicy::kReplace);
  auto view = b.to(1, CoordKind::kView);
  ASSERT_EQ(view.size(), 1u);
  EXPECT_EQ(view[0].epoch, 2u);
  EXPECT_EQ(membersOf(view[0]), (std::vector<uint64_t>{1, 2, 9}));
}

TEST(CoordinatorTakeover, AMemberThatDoesNotComeBackIsDeclaredAndTheFencedStayFenced) {
  Harness a;
  for (uint64_t m = 1; m <= 4; ++m) a.joinRank(m, static_cast<int64_t>(m - 1), 4);
  a.closed(4);  // failed and fenced before the takeover
  Harness b;
  b.core.importState(a.core.exportState(), b.now);
  b.resume(1, Role::kRank, 1);
  b.resume(2, Role::kRank, 1);
  b.resume(4, Role::kRank, 1);
  EXPECT_EQ(b.to(4, CoordKind::kEvicted).size(), 1u);
  b.clear();
  b.advance(3500ms, {1, 2});  // member 3 never reconnects
  auto failed = b.to(1, CoordKind::kFailed);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].members, (std::vector<uint64_t>{4, 3}));
  EXPECT_NE(failed[0].text.find("did not reconnect"), std::string::npos) << failed[0].text;
  EXPECT_TRUE(b.to(2, CoordKind::kEvicted).empty());
}

TEST(CoordinatorTakeover, ARankVacantBeforeFormingStaysVacant) {
  Harness a;
  a.joinRank(1, 0, 3);
  CoordMessage m;
  m.kind = CoordKind::kRankExited;
  m.rank = 2;
  m.text = "pid 77 killed by signal 9";
  a.first(9, m);
  Harness b;
  b.core.importState(a.core.exportState(), b.now);
  CoordMessage q;
  q.kind = CoordKind::kStatusQuery;
  b.first(9, q);
  auto status = b.to(9, CoordKind::kStatus);
  ASSERT_EQ(status.size(), 1u);
  EXPECT_NE(status[0].text.find("waiting for a standby: 2 (pid 77 killed by signal 9)"), std::string::npos)
      << status[0].text;
}

TEST(CoordinatorTakeover, EpochNumbersAreNeverReusedAcrossALeaderChange) {
  Harness a;
  prepareMigration(a);  // epoch 2 announced, then everyone gives up
  for (uint64_t id : {1, 9, 3}) a.say(id, CoordKind::kSwitchFailed, 2);
  Harness b;
  b.core.importState(a.core.exportState(), b.now);
  for (uint64_t m : {1, 2, 3}) b.resume(m, Role::kRank, 1);
  b.joinStandby(10);
  CoordMessage m;
  m.kind = CoordKind::kMigrate;
  m.rank = 0;
  b.say(1, m);
  ASSERT_EQ(b.to(10, CoordKind::kPrepare).size(), 1u);
  EXPECT_EQ(b.to(10, CoordKind::kPrepare)[0].epoch, 3u);
}

// READY went out, the members voted yes in band and the leader died before
// hearing it: the successor knows the migration, a member back in the next
// epoch is that yes, and the leaver's wait for the outcome ends.
TEST(CoordinatorTakeover, AMigrationVotedInBandCommitsWithTheSuccessor) {
  Harness a;
  prepareMigration(a);  // rank 1 (member 2) to standby 9, epoch 2, READY sent
  Harness b;
  b.core.importState(a.core.exportState(), b.now);
  b.resume(2, Role::kRank, 1);  // the leaver, still waiting
  ASSERT_EQ(b.to(2, CoordKind::kPrepare).size(), 1u);  // told again: its client keeps what it had
  ASSERT_EQ(b.to(2, CoordKind::kPrepareReady).size(), 1u);
  b.say(2, CoordKind::kSwitchover, 2);  // what it told the dead leader, told again
  EXPECT_EQ(b.core.currentEpoch(), 1u);
  b.clear();
  b.resume(1, Role::kRank, 2);  // in epoch 2 already
  EXPECT_EQ(b.core.currentEpoch(), 2u);
  EXPECT_EQ(b.core.currentView(), (std::vector<uint64_t>{1, 9, 3}));
  ASSERT_EQ(b.to(1, CoordKind::kView).size(), 1u);
  EXPECT_EQ(b.to(1, CoordKind::kView)[0].epoch, 2u);  // its client takes it as an acknowledgement
  ASSERT_EQ(b.to(2, CoordKind::kView).size(), 1u);
  EXPECT_EQ(b.to(2, CoordKind::kView)[0].rank, -1);  // the leaver has left
  b.resume(3, Role::kRank, 2);
  b.resume(9, Role::kStandby, 2);
  EXPECT_EQ(b.to(9, CoordKind::kView).back().rank, 1);
  EXPECT_EQ(b.sentOfKind(CoordKind::kError), 0u);
  EXPECT_EQ(b.sentOfKind(CoordKind::kPrepareFailed), 0u);
}

// The leader died with the members still preparing: the successor tells
// each participant the migration again and sends READY once the last
// member is prepared.
TEST(CoordinatorTakeover, AMigrationBeingPreparedGoesOnWithTheSuccessor) {
  Harness a;
  announceMigration(a);
  for (uint64_t id : {1, 9}) a.say(id, CoordKind::kPrepared, 2);
  Harness b;
  b.core.importState(a.core.exportState(), b.now);
  for (uint64_t id : {1, 2, 3}) b.resume(id, Role::kRank, 1);
  b.resume(9, Role::kStandby, 1);
  for (uint64_t id : {1, 2, 3, 9}) {
    ASSERT_EQ(b.to(id, CoordKind::kPrepare).size(), 1u) << id;
    EXPECT_EQ(b.to(id, CoordKind::kPrepare)[0].epoch, 2u);
    EXPECT_EQ(b.to(id, CoordKind::kPrepare)[0].member, 9u);
    EXPECT_TRUE(b.to(id, CoordKind::kPrepareReady).empty()) << id;
  }
  b.clear();
  b.say(1, CoordKind::kPrepared, 2);  // told again: counted once
  EXPECT_EQ(b.sentOfKind(CoordKind::kPrepareReady), 0u);
  b.say(3, CoordKind::kPrepared, 2);
  for (uint64_t id : {1, 2, 3, 9}) EXPECT_EQ(b.to(id, CoordKind::kPrepareReady).size(), 1u) << id;
  b.clear();
  b.say(3, CoordKind::kSwitched, 2);
  EXPECT_EQ(b.core.currentEpoch(), 2u);
  EXPECT_EQ(b.core.currentView(), (std::vector<uint64_t>{1, 9, 3}));
}

// The last leader aborted the migration and died before every member read
// the abort: a member telling the successor it is prepared hears it.
TEST(CoordinatorTakeover, AnAbortedMigrationIsToldToAMemberThatMissedIt) {
  Harness a;
  announceMigration(a);
  a.closed(3);  // a member of the next view dies while it is prepared: aborted
  Harness b;
  b.core.importState(a.core.exportState(), b.now);
  b.resume(1, Role::kRank, 1);
  EXPECT_TRUE(b.to(1, CoordKind::kPrepare).empty());
  b.say(1, CoordKind::kPrepared, 2);
  auto aborted = b.to(1, CoordKind::kPrepareFailed);
  ASSERT_EQ(aborted.size(), 1u);
  EXPECT_EQ(aborted[0].epoch, 2u);
  EXPECT_THAT(aborted[0].text, HasSubstr("was aborted"));
}

TEST(CoordinatorTakeover, OnlyMembersItKnowsResumeAndAFreshJoinCannotTakeTheirIds) {
  Harness a;
  formThree(a);
  Harness b;
  b.core.importState(a.core.exportState(), b.now);
  b.resume(7, Role::kRank, 1);
  EXPECT_NE(b.to(7, CoordKind::kError).at(0).text.find("does not know the member"), std::string::npos);
  b.joinStandby(2);  // member 2's id, not resuming
  EXPECT_NE(b.to(2, CoordKind::kError).at(0).text.find("already in use"), std::string::npos);
  b.clear();
  b.resume(2, Role::kRank, 1);
  EXPECT_EQ(b.to(2, CoordKind::kView).at(0).rank, 1);
  b.resume(2, Role::kRank, 1);  // twice
  EXPECT_NE(b.to(2, CoordKind::kError).at(0).text.find("connected already"), std::string::npos);
}

TEST(CoordinatorTakeover, StateChangesAreFlaggedAndHeartbeatsAreNot) {
  Harness h;
  formThree(h);
  EXPECT_TRUE(h.core.takeStateChanged());
  h.advance(1000ms, {1, 2, 3});
  EXPECT_FALSE(h.core.takeStateChanged());
  h.say(1, CoordKind::kLeave);
  EXPECT_TRUE(h.core.takeStateChanged());
}

// What a refusal says, or "" when the state was taken.
std::string importRefusal(const CoordinatorState& state) {
  try {
    CoordinatorCore core({});
    core.importState(state, {});
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

TEST(CoordinatorTakeover, MalformedStateIsRefusedNamingWhat) {
  Harness h;
  formThree(h);
  const CoordinatorState good = h.core.exportState();
  ASSERT_EQ(good.size(), 81u);  // the head, 64 member buckets, 16 view chunks: one etcd txn
  EXPECT_EQ(importRefusal(good), "");
  auto with = [&](const std::string& key, const std::string& value) {
    CoordinatorState s = good;
    s[key] = value;
    return importRefusal(s);
  };
  EXPECT_THAT(with("head", "not json"), HasSubstr("is malformed (head)"));
  EXPECT_THAT(with("head", "{\"version\": 1}"), HasSubstr("version 1"));
  EXPECT_THAT(with("view/00", "[1,"), HasSubstr("is malformed (view/00)"));
  EXPECT_THAT(with("view/15", "[77]"), HasSubstr("hold 4 ranks where the head says 3"));
  // A member filed under another bucket than its id's: the parts do not fit together.
  EXPECT_THAT(with("members/05", "{\"m\":[[1,0,\"x\",1,1,0,0,0]],\"r\":[]}"), HasSubstr("members/05"));
  EXPECT_THAT(with("extra", "1"), HasSubstr("82 parts where it should have 81"));
  CoordinatorState missing = good;
  missing.erase("members/63");
  EXPECT_THAT(importRefusal(missing), HasSubstr("no part 'members/63'"));
}

// A failure rewrites the head and the failed member's bucket, not the job.
TEST(CoordinatorTakeover, AFailureChangesFewParts) {
  Harness h;
  formThree(h);
  const CoordinatorState before = h.core.exportState();
  h.closed(2);
  const CoordinatorState after = h.core.exportState();
  std::vector<std::string> changed;
  for (auto& [key, value] : after)
    if (before.at(key) != value) changed.push_back(key);
  EXPECT_THAT(changed, ::testing::Contains("head"));
  EXPECT_LE(changed.size(), 2u) << ::testing::PrintToString(changed);
}

}  // namespace
}  // namespace eccl::membership
