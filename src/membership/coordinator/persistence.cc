// The durable state, as JSON: what a coordinator taking over needs to go
// on where the last one stopped (core.h says what is left out).
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/log.h"
#include "membership/coordinator/core.h"

namespace eccl::membership {
namespace {

using nlohmann::json;
constexpr int kStateVersion = 1;

template <typename Map>
json pairs(const Map& m) {
  json out = json::array();
  for (auto& [k, v] : m) out.push_back(json::array({k, v}));
  return out;
}

}  // namespace

std::string CoordinatorCore::exportState() const {
  json s;
  s["version"] = kStateVersion;
  s["nranks"] = nranks;
  s["epoch"] = epoch;
  s["issued"] = issued;
  s["joins"] = joins;
  s["viewUuid"] = viewUuid;
  s["view"] = view;
  s["failed"] = failed;
  s["failedNeededFrom"] = pairs(failedNeededFrom);
  s["fenced"] = fenced;
  s["gone"] = gone;
  s["rankOf"] = pairs(rankOf);
  s["eagerListSent"] = eagerListSent;
  s["lastFailure"] = lastFailure;
  s["lastAbort"] = lastAbort;
  json ms = json::array();
  for (auto& [id, m] : members)
    ms.push_back({{"id", id},
                  {"role", static_cast<uint32_t>(m.role)},
                  {"address", m.address},
                  {"pid", m.pid},
                  {"joinOrder", m.joinOrder},
                  {"ask", static_cast<int>(m.ask)},
                  {"askArg", m.askArg},
                  {"left", m.left},
                  {"eager", m.eager},
                  {"retired", m.retired},
                  {"leftOut", m.leftOut}});
  s["members"] = ms;
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
  return s.dump();
}

void CoordinatorCore::importState(const std::string& text, Time at) {
  ECCL_CHECK_ARG(members.empty() && view.empty(), "a coordinator's state is imported before it serves anyone");
  now = at;
  try {
    json s = json::parse(text);
    if (s.at("version").get<int>() != kStateVersion)
      fail(ecclInvalidUsage, "coordinator state version {} (this coordinator reads {})", s.at("version").dump(),
           kStateVersion);
    nranks = s.at("nranks");
    epoch = s.at("epoch");
    issued = s.at("issued");
    joins = s.at("joins");
    viewUuid = s.at("viewUuid");
    view = s.at("view").get<std::vector<uint64_t>>();
    failed = s.at("failed").get<std::vector<uint64_t>>();
    for (auto& p : s.at("failedNeededFrom")) failedNeededFrom[p.at(0)] = p.at(1);
    fenced = s.at("fenced").get<std::set<uint64_t>>();
    gone = s.at("gone").get<std::set<uint64_t>>();
    for (auto& p : s.at("rankOf")) rankOf[p.at(0)] = p.at(1);
    eagerListSent = s.at("eagerListSent");
    lastFailure = s.at("lastFailure");
    lastAbort = s.at("lastAbort");
    for (auto& j : s.at("members")) {
      Member m;
      m.id = j.at("id");
      m.role = static_cast<Role>(j.at("role").get<uint32_t>());
      m.address = j.at("address");
      m.pid = j.at("pid");
      m.joinOrder = j.at("joinOrder");
      m.ask = static_cast<Member::Ask>(j.at("ask").get<int>());
      m.askArg = j.at("askArg");
      m.left = j.at("left");
      m.eager = j.at("eager");
      m.retired = j.at("retired");
      m.leftOut = j.at("leftOut");
      m.restored = !fenced.count(m.id);  // a failed member stays failed: nobody waits for it
      m.lastHeard = now;  // from now on it has heartbeatTimeoutMs to come back
      if (m.id == 0 || (m.role != Role::kRank && m.role != Role::kStandby) ||
          static_cast<int>(m.ask) > static_cast<int>(Member::Ask::kGrow))
        fail(ecclInvalidUsage, "member entry {} is malformed", j.dump());
      members[m.id] = std::move(m);
    }
    for (auto& g : s.at("groups")) groups[g.at(0)] = g.at(1).get<std::set<uint64_t>>();
    for (auto& b : s.at("brokenGroups")) brokenGroups[b.at(0)] = {b.at(1), b.at(2)};
    for (auto& a : s.at("reconfigureAsks")) reconfigureAsks[a.at(0)] = {a.at(1), a.at(2).get<std::vector<uint64_t>>()};
    for (auto& p : s.at("usedUuids")) usedUuids[p.at(0)] = p.at(1);
    for (auto& p : s.at("refusedUuids")) refusedUuids[p.at(0)] = p.at(1);
  } catch (const json::exception& e) {
    fail(ecclInvalidUsage, "coordinator state is malformed: {}", e.what());
  }
  for (uint64_t m : view)
    if (!members.count(m) && !isFailed(m))
      fail(ecclInvalidUsage, "coordinator state names member {:016x} in the view but not among the members", m);
  log::info("coordinator: took over at epoch {} with {} ranks and {} members known; waiting for them to reconnect",
            epoch, view.size(), members.size());
}

}  // namespace eccl::membership
