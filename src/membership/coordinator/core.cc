#include "membership/coordinator/core.h"

#include <algorithm>

#include "common/log.h"

namespace eccl::membership {

void CoordinatorCore::onFirstMessage(uint64_t conn, const std::string& peer, CoordMessage first, Time at) {
  now = at;
  stateChanged = true;
  if (first.kind != CoordKind::kJoin) first.role = Role::kTool;  // a status query or a migration request
  if (first.role == Role::kTool) return answerTool(conn, peer, first);
  join(conn, peer, first);
}

void CoordinatorCore::onMessage(uint64_t conn, const CoordMessage& msg, Time at) {
  now = at;
  auto it = memberOfConn.find(conn);
  if (it == memberOfConn.end()) return;  // its member is gone: the driver closes it
  if (msg.kind != CoordKind::kHeartbeat) stateChanged = true;
  dispatch(it->second, msg);
}

void CoordinatorCore::onClosed(uint64_t conn, const std::string& error, Time at) {
  now = at;
  auto it = memberOfConn.find(conn);
  if (it == memberOfConn.end()) return;
  const uint64_t member = it->second;
  stateChanged = true;
  memberOfConn.erase(it);
  members.at(member).conn = 0;
  // A member that said goodbye may close with our heartbeats unread, which
  // resets the connection: that is still its orderly exit.
  if (members.at(member).left) return departed(member);
  if (!error.empty()) return declareFailed(member, error);
  declareFailed(member, "its connection to the coordinator closed (process exited or was killed)");
}

void CoordinatorCore::onUnreachable(uint64_t conn) {
  auto it = memberOfConn.find(conn);
  if (it != memberOfConn.end()) members.at(it->second).unreachable = true;
}

void CoordinatorCore::onTick(Time at) {
  now = at;
  if (!started) {
    started = true;
    for (int k = 0; k < kBeatSlices; ++k)
      sliceDue[k] = now + std::chrono::milliseconds(opt.heartbeatMs) * k / kBeatSlices;
  }
  if (!heldReports.empty()) settleHeldReports();
  if (replaceHeldUntil && now >= *replaceHeldUntil) {
    stateChanged = true;
    tryRecover();  // refuses it
  }
  // Each slice keeps its phase: after a late round the slices stay spread
  // rather than all falling due together from then on.
  const auto period = std::chrono::milliseconds(opt.heartbeatMs);
  for (int k = 0; k < kBeatSlices; ++k)
    if (now >= sliceDue[k]) {
      sliceDue[k] += period * ((now - sliceDue[k]) / period + 1);
      heartbeat(k);
    }
}

CoordinatorCore::Time CoordinatorCore::nextWake() const {
  Time wake = started ? *std::min_element(sliceDue.begin(), sliceDue.end()) : now;
  if (replaceHeldUntil) wake = std::min(wake, *replaceHeldUntil);
  for (const HeldReport& r : heldReports) wake = std::min(wake, r.until);
  return wake;
}

void CoordinatorCore::sendTo(uint64_t conn, const CoordMessage& msg, CoordAction::Kind kind, bool quiet) {
  actions.push_back({kind, conn, std::make_shared<const CoordMessage>(msg), quiet});
}

// Best effort: a member that cannot take a message is dealt with by its
// heartbeat or its closed connection, not here.
void CoordinatorCore::send(Member& m, const CoordMessage& msg) {
  if (m.conn && !m.unreachable) sendTo(m.conn, msg, CoordAction::Kind::kSend);
}

void CoordinatorCore::send(Member& m, const std::shared_ptr<const CoordMessage>& msg) {
  if (m.conn && !m.unreachable) actions.push_back({CoordAction::Kind::kSend, m.conn, msg, false});
}

void CoordinatorCore::closeConnection(Member& m) {
  if (!m.conn) return;
  actions.push_back({CoordAction::Kind::kClose, m.conn, nullptr, false});
  memberOfConn.erase(m.conn);
  m.conn = 0;
}

void CoordinatorCore::eraseMember(uint64_t member) {
  auto it = members.find(member);
  if (it == members.end()) return;
  closeConnection(it->second);
  members.erase(it);
  entriesOfEpoch.reset();  // a member of the view that left has no address in it any more
  changes.reset();
}

void CoordinatorCore::sendView(uint64_t member, const std::string& why) {
  auto it = members.find(member);
  if (it == members.end()) return;
  Member& m = it->second;
  CoordMessage v;
  v.kind = CoordKind::kView;
  v.epoch = epoch;
  auto pos = std::find(view.begin(), view.end(), member);
  v.rank = pos == view.end() ? -1 : pos - view.begin();
  v.nranks = static_cast<uint32_t>(view.size());
  v.text = why;
  v.uuid = viewUuid;
  const bool holdsPrevious = m.viewHeld != 0 && m.viewHeld == previousEpoch && previousEpoch != epoch;
  if (holdsPrevious && changesSincePrevious().worthIt) {
    const Changes& c = *changes;
    v.policy = kViewDelta;
    v.pid = previousEpoch;
    v.member = c.checksum;
    v.members = c.ranks;
    v.entries = c.entries;
  } else {
    v.encoded = entries();
  }
  if (m.conn && !m.unreachable) m.viewHeld = epoch;
  send(m, v);
}

void CoordinatorCore::replaceView(std::vector<uint64_t> next) {
  previousEntries = view.empty() ? std::vector<ViewEntry>{} : entries()->entries;
  previousEpoch = epoch;
  view = std::move(next);
  changes.reset();
}

const CoordinatorCore::Changes& CoordinatorCore::changesSincePrevious() const {
  if (changes && changes->epoch == epoch) return *changes;
  Changes c;
  c.epoch = epoch;
  const auto whole = entries();
  const auto& current = whole->entries;
  for (size_t r = 0; r < current.size(); ++r)
    if (r >= previousEntries.size() || !(current[r] == previousEntries[r])) {
      c.ranks.push_back(r);
      c.entries.push_back(current[r]);
    }
  // Changes cost about what the entries do: beyond a quarter of the view,
  // the whole view is simpler for everyone.
  c.worthIt = !previousEntries.empty() && c.ranks.size() * 4 <= current.size();
  c.checksum = viewChecksum(current);
  changes = std::move(c);
  return *changes;
}

void CoordinatorCore::sendError(uint64_t member, const std::string& text) {
  auto it = members.find(member);
  if (it == members.end()) return;
  CoordMessage e;
  e.kind = CoordKind::kError;
  e.text = text;
  send(it->second, e);
}

std::string CoordinatorCore::label(uint64_t member) const {
  auto it = std::find(view.begin(), view.end(), member);
  auto m = members.find(member);
  std::string where = m == members.end() ? "" : fmt::format(" at {}", m->second.address);
  if (it != view.end()) return fmt::format("rank {} (member {:016x}{})", it - view.begin(), member, where);
  return fmt::format("member {:016x}{}", member, where);
}

std::shared_ptr<const EncodedEntries> CoordinatorCore::entries() const {
  if (entriesOfEpoch && entriesEpoch == epoch && entriesOfEpoch->entries.size() == view.size()) return entriesOfEpoch;
  std::vector<ViewEntry> out;
  out.reserve(view.size());
  for (uint64_t m : view) {
    auto it = members.find(m);
    out.push_back({m, it == members.end() ? "" : it->second.address});
  }
  entriesOfEpoch = encodeEntries(std::move(out));
  entriesEpoch = epoch;
  return entriesOfEpoch;
}

bool CoordinatorCore::inView(uint64_t member) const {
  return std::find(view.begin(), view.end(), member) != view.end();
}

bool CoordinatorCore::isFailed(uint64_t member) const {
  return std::find(failed.begin(), failed.end(), member) != failed.end();
}

bool CoordinatorCore::usableStandby(const Member& m) const {
  return m.role == Role::kStandby && m.conn && !m.retired && !m.leftOut;
}

// In registration order; with `withReserved`, the standbys a held REPLACE
// reserved count too (they are its to use).
std::vector<uint64_t> CoordinatorCore::idleStandbys(bool withReserved) const {
  std::vector<uint64_t> out;
  for (auto& [mid, m] : members)
    if (withReserved ? usableStandby(m) : idleStandby(m)) out.push_back(mid);
  std::sort(out.begin(), out.end(),
            [&](uint64_t a, uint64_t b) { return members.at(a).joinOrder < members.at(b).joinOrder; });
  return out;
}

bool CoordinatorCore::isJoiner(uint64_t m) const {
  return pending && std::find(pending->joiners.begin(), pending->joiners.end(), m) != pending->joiners.end();
}

std::vector<uint64_t> CoordinatorCore::pendingParticipants() const {
  std::vector<uint64_t> all = pending->next;
  all.insert(all.end(), pending->leavers.begin(), pending->leavers.end());
  return all;
}

// The members of the view still alive if every one of them has asked for
// `ask`; nothing if someone has not yet.
std::optional<std::vector<uint64_t>> CoordinatorCore::everyoneAsked(Member::Ask ask) {
  // Each ask comes here: look first from where the last look found someone
  // who had not asked (members ask in about rank order), so thousands of
  // asks cost about one pass over the view rather than one each.
  const size_t n = view.size();
  for (size_t k = 0; k < n; ++k) {
    const size_t r = (askHint + k) % n;
    if (isFailed(view[r])) continue;
    auto it = members.find(view[r]);
    if (it == members.end() || it->second.ask != ask) {
      askHint = r;
      return std::nullopt;
    }
  }
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

std::string CoordinatorCore::describeMembers(const std::vector<uint64_t>& list) {
  std::string out;
  for (uint64_t m : list) out += fmt::format("{}{:016x}", out.empty() ? "[" : ", ", m);
  return out + "]";
}

std::set<uint64_t> CoordinatorCore::idleStandbyPids() const {
  std::set<uint64_t> idle;
  for (auto& [mid, m] : members)
    if (m.role == Role::kStandby && !m.reserved) idle.insert(m.pid);
  return idle;
}

std::set<uint64_t> CoordinatorCore::viewPids() const {
  std::set<uint64_t> pids;
  for (uint64_t mid : view)
    if (auto it = members.find(mid); it != members.end()) pids.insert(it->second.pid);
  return pids;
}

}  // namespace eccl::membership
