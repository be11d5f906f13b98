// The durable state, as JSON in parts (CoordinatorState): a head with the
// epoch, fences and named memberships; the members and their requested
// ranks in kMemberBuckets buckets by member id; the view in kViewChunks
// chunks by rank. A failure at 4,096 members rewrites the head and one
// bucket (a few KB) rather than the whole job (900 KB, 60 ms in etcd),
// and the set of parts never changes, so a write never deletes one.
// The buckets are written by hand: building them as JSON objects took
// most of the 18 ms an export cost at 4,096 members, on the loop that
// serves the members (core.h says what is left out of the state).
#include <iterator>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/log.h"
#include "membership/coordinator/core.h"

namespace eccl::membership {
namespace {

using nlohmann::json;
constexpr int kStateVersion = 2;
constexpr size_t kMemberBuckets = 64;  // with the chunks and the head: 81 keys, in one etcd txn (128 at most)
constexpr size_t kViewChunks = 16;

// Bits of a persisted member's flags.
constexpr uint32_t kLeft = 1, kEager = 2, kRetired = 4, kLeftOut = 8;

template <typename Map>
json pairs(const Map& m) {
  json out = json::array();
  for (auto& [k, v] : m) out.push_back(json::array({k, v}));
  return out;
}

std::string bucketKey(size_t b) { return fmt::format("members/{:02}", b); }
std::string chunkKey(size_t c) { return fmt::format("view/{:02}", c); }
size_t chunkRanks(size_t viewSize) { return (viewSize + kViewChunks - 1) / kViewChunks; }

const std::string& part(const CoordinatorState& state, const std::string& key) {
  auto it = state.find(key);
  if (it == state.end()) fail(ecclInvalidUsage, "coordinator state has no part '{}'", key);
  return it->second;
}

}  // namespace

CoordinatorState CoordinatorCore::exportState() const {
  CoordinatorState out;
  json s;
  s["version"] = kStateVersion;
  s["nranks"] = nranks;
  s["epoch"] = epoch;
  s["issued"] = issued;
  s["joins"] = joins;
  s["viewUuid"] = viewUuid;
  s["viewSize"] = view.size();
  s["failed"] = failed;
  s["failedNeededFrom"] = pairs(failedNeededFrom);
  s["fenced"] = fenced;
  s["gone"] = gone;
  json vacant = json::array();
  for (auto& [rank, how] : vacantRanks) vacant.push_back(json::array({rank, how}));
  s["vacantRanks"] = vacant;
  s["eagerListSent"] = eagerListSent;
  s["lastFailure"] = lastFailure;
  s["lastAbort"] = lastAbort;
  json gs = json::array();
  for (auto& [uuid, group] : groups) gs.push_back(json::array({uuid, group}));
  s["groups"] = gs;
  json broken = json::array();
  for (auto& [uuid, why] : brokenGroups) broken.push_back(json::array({uuid, why.first, why.second}));
  s["brokenGroups"] = broken;
  json asks = json::array();
  for (auto& [asker, ask] : reconfigureAsks) asks.push_back(json::array({asker, ask.uuid, ask.members}));
  s["reconfigureAsks"] = asks;
  s["usedUuids"] = pairs(usedUuids);
  s["refusedUuids"] = pairs(refusedUuids);
  s["pending"] = nullptr;
  if (pending) {
    const Pending& p = *pending;
    s["pending"] = {{"epoch", p.epoch},         {"next", p.next},
                    {"joiners", p.joiners},     {"leavers", p.leavers},
                    {"leavingRank", p.leavingRank}, {"prepared", p.prepared},
                    {"switching", p.switching}, {"voting", p.voting},
                    {"votedYes", p.votedYes},   {"gaveUp", p.gaveUp},
                    {"lost", p.lost},           {"recovering", p.recovering},
                    {"firstLoss", p.firstLoss}, {"firstLossIsDeath", p.firstLossIsDeath},
                    {"story", p.story}};
  }
  out["head"] = s.dump();

  std::array<std::string, kMemberBuckets> memberText, ranks;
  for (auto& [id, m] : members) {
    std::string& b = memberText[id % kMemberBuckets];
    const uint32_t flags = (m.left ? kLeft : 0) | (m.eager ? kEager : 0) | (m.retired ? kRetired : 0) |
                           (m.leftOut ? kLeftOut : 0);
    fmt::format_to(std::back_inserter(b), "{}[{},{},{},{},{},{},{},{}]", b.empty() ? "" : ",", id,
                   static_cast<uint32_t>(m.role), json(m.address).dump(), m.pid, m.joinOrder, static_cast<int>(m.ask),
                   m.askArg, flags);
  }
  for (auto& [id, rank] : rankOf) {
    std::string& b = ranks[id % kMemberBuckets];
    fmt::format_to(std::back_inserter(b), "{}[{},{}]", b.empty() ? "" : ",", id, rank);
  }
  for (size_t b = 0; b < kMemberBuckets; ++b)
    out[bucketKey(b)] = fmt::format("{{\"m\":[{}],\"r\":[{}]}}", memberText[b], ranks[b]);

  const size_t per = chunkRanks(view.size());
  for (size_t c = 0; c < kViewChunks; ++c) {
    const size_t from = std::min(view.size(), c * per), to = std::min(view.size(), from + per);
    out[chunkKey(c)] = fmt::format("[{}]", fmt::join(view.begin() + from, view.begin() + to, ","));
  }
  return out;
}

void CoordinatorCore::importState(const CoordinatorState& state, Time at) {
  ECCL_CHECK_ARG(members.empty() && view.empty(), "a coordinator's state is imported before it serves anyone");
  now = at;
  std::string where = "head";
  try {
    json s = json::parse(part(state, "head"));
    if (s.at("version").get<int>() != kStateVersion)
      fail(ecclInvalidUsage, "coordinator state version {} (this coordinator reads {})", s.at("version").dump(),
           kStateVersion);
    nranks = s.at("nranks");
    epoch = s.at("epoch");
    issued = s.at("issued");
    joins = s.at("joins");
    viewUuid = s.at("viewUuid");
    const size_t viewSize = s.at("viewSize");
    failed = s.at("failed").get<std::vector<uint64_t>>();
    for (auto& p : s.at("failedNeededFrom")) failedNeededFrom[p.at(0)] = p.at(1);
    fenced = s.at("fenced").get<std::set<uint64_t>>();
    gone = s.at("gone").get<std::set<uint64_t>>();
    if (s.contains("vacantRanks"))  // absent from a state written before launchers reported ranks that ended
      for (auto& p : s.at("vacantRanks")) vacantRanks[p.at(0)] = p.at(1);
    eagerListSent = s.at("eagerListSent");
    lastFailure = s.at("lastFailure");
    lastAbort = s.at("lastAbort");
    for (auto& g : s.at("groups")) groups[g.at(0)] = g.at(1).get<std::set<uint64_t>>();
    for (auto& b : s.at("brokenGroups")) brokenGroups[b.at(0)] = {b.at(1), b.at(2)};
    for (auto& a : s.at("reconfigureAsks")) reconfigureAsks[a.at(0)] = {a.at(1), a.at(2).get<std::vector<uint64_t>>()};
    for (auto& p : s.at("usedUuids")) usedUuids[p.at(0)] = p.at(1);
    for (auto& p : s.at("refusedUuids")) refusedUuids[p.at(0)] = p.at(1);
    if (const json& j = s.at("pending"); !j.is_null()) {
      Pending p;
      p.epoch = j.at("epoch");
      p.next = j.at("next").get<std::vector<uint64_t>>();
      p.joiners = j.at("joiners").get<std::vector<uint64_t>>();
      p.leavers = j.at("leavers").get<std::vector<uint64_t>>();
      p.leavingRank = j.at("leavingRank");
      p.prepared = j.at("prepared").get<std::set<uint64_t>>();
      p.switching = j.at("switching").get<std::set<uint64_t>>();
      p.voting = j.at("voting");
      p.votedYes = j.at("votedYes").get<std::set<uint64_t>>();
      p.gaveUp = j.at("gaveUp").get<std::set<uint64_t>>();
      p.lost = j.at("lost").get<std::set<uint64_t>>();
      p.recovering = j.at("recovering").get<std::set<uint64_t>>();
      p.firstLoss = j.at("firstLoss");
      p.firstLossIsDeath = j.at("firstLossIsDeath");
      p.story = j.at("story");
      if (p.joiners.empty() || p.leavers.empty() || p.next.empty())
        fail(ecclInvalidUsage, "the migration being prepared names no joiner, leaver or next view");
      pending = std::move(p);
    }

    for (size_t b = 0; b < kMemberBuckets; ++b) {
      where = bucketKey(b);
      json bucket = json::parse(part(state, where));
      for (auto& j : bucket.at("m")) {
        Member m;
        m.id = j.at(0);
        m.role = static_cast<Role>(j.at(1).get<uint32_t>());
        m.address = j.at(2);
        m.pid = j.at(3);
        m.joinOrder = j.at(4);
        m.ask = static_cast<Member::Ask>(j.at(5).get<int>());
        m.askArg = j.at(6);
        const uint32_t flags = j.at(7);
        m.left = flags & kLeft;
        m.eager = flags & kEager;
        m.retired = flags & kRetired;
        m.leftOut = flags & kLeftOut;
        m.restored = !fenced.count(m.id);  // a failed member stays failed: nobody waits for it
        m.lastHeard = now;  // from now on it has heartbeatTimeoutMs to come back
        if (m.id == 0 || m.id % kMemberBuckets != b || (m.role != Role::kRank && m.role != Role::kStandby) ||
            static_cast<int>(m.ask) > static_cast<int>(Member::Ask::kGrow) || flags > 15)
          fail(ecclInvalidUsage, "member entry {} is malformed", j.dump());
        members[m.id] = std::move(m);
      }
      for (auto& p : bucket.at("r")) rankOf[p.at(0)] = p.at(1);
    }
    for (size_t c = 0; c < kViewChunks; ++c) {
      where = chunkKey(c);
      for (uint64_t m : json::parse(part(state, where)).get<std::vector<uint64_t>>()) view.push_back(m);
    }
    where = "view";
    if (view.size() != viewSize)
      fail(ecclInvalidUsage, "the view's chunks hold {} ranks where the head says {}", view.size(), viewSize);
  } catch (const json::exception& e) {
    fail(ecclInvalidUsage, "coordinator state is malformed ({}): {}", where, e.what());
  } catch (const Error& e) {
    fail(e.code(), "coordinator state ({}): {}", where, e.what());
  }
  if (state.size() != 1 + kMemberBuckets + kViewChunks)
    fail(ecclInvalidUsage, "coordinator state has {} parts where it should have {}", state.size(),
         1 + kMemberBuckets + kViewChunks);
  for (uint64_t m : view)
    if (!members.count(m) && !isFailed(m))
      fail(ecclInvalidUsage, "coordinator state names member {:016x} in the view but not among the members", m);
  if (pending)
    for (uint64_t m : pendingParticipants())
      if (!members.count(m) && !fenced.count(m) && !gone.count(m))
        fail(ecclInvalidUsage, "coordinator state's migration names member {:016x}, unknown to it", m);
  log::info("coordinator: took over at epoch {} with {} ranks and {} members known; waiting for them to reconnect",
            epoch, view.size(), members.size());
  if (pending)
    log::info("coordinator: took over a migration to epoch {} ({}): {} of {} prepared, READY {}; it goes on",
              pending->epoch, pending->story, pending->prepared.size(), pending->next.size(),
              pending->voting ? "sent" : "not sent yet");
}

}  // namespace eccl::membership
