// Memberships named outright (c10d's reconfigure, torchft's quorum): the
// view becomes the list every member it names asked for with one uuid.
#include <algorithm>

#include "common/log.h"
#include "membership/coordinator/core.h"

namespace eccl::membership {

bool CoordinatorCore::notRegisteredYet(uint64_t m) const {
  return !members.count(m) && !fenced.count(m) && !gone.count(m);
}

// Why `m` cannot be in a named membership, or "".
std::string CoordinatorCore::unfitForReconfiguration(uint64_t m) const {
  auto it = members.find(m);
  if (it == members.end() || fenced.count(m))
    return fmt::format("member {:016x} is not registered with this job (it exited, failed, or belongs to another job)",
                       m);
  if (isFailed(m)) return fmt::format("{} has failed", label(m));
  if (!inView(m) && !usableStandby(it->second) && !it->second.leftOut)
    return fmt::format("member {:016x} is neither in the current view nor an idle standby", m);
  return "";
}

// Refuses every ask of `uuid` with `why`.
void CoordinatorCore::refuseReconfiguration(uint64_t uuid, const std::string& why) {
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

void CoordinatorCore::refuseReconfigurationsNaming(uint64_t member, const std::string& why) {
  std::set<uint64_t> uuids;
  for (auto& [asker, ask] : reconfigureAsks)
    if (asker == member || std::count(ask.members.begin(), ask.members.end(), member)) uuids.insert(ask.uuid);
  for (uint64_t u : uuids) refuseReconfiguration(u, fmt::format("a member it names is gone: {}", why));
}

// The view becomes `msg.members`, in that order, once every member it
// names has asked with the same list and uuid. Members of the current view
// it leaves out are leavers; standbys it names are promoted; connections
// between members kept are inherited.
void CoordinatorCore::onReconfigure(uint64_t from, const CoordMessage& msg) {
  auto fail = [&](const std::string& why) {
    sendError(from, fmt::format("reconfiguration {:016x} refused: {}", msg.uuid, why));
  };
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
    return refuseReconfiguration(msg.uuid, fmt::format("callers disagree: {} named {}, {} named {}", label(asker),
                                                       describeMembers(ask.members), label(from),
                                                       describeMembers(msg.members)));
  }
  for (uint64_t m : msg.members) {
    auto a = reconfigureAsks.find(m);
    if (a == reconfigureAsks.end() || a->second.uuid != msg.uuid) return;  // still waiting for m
  }
  commitReconfiguration(msg.uuid, msg.members);
}

void CoordinatorCore::commitReconfiguration(uint64_t uuid, const std::vector<uint64_t>& next) {
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

}  // namespace eccl::membership
