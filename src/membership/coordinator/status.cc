// What `ecclcoord status` prints: the view, the standbys, each member's
// health and whatever is under way.
#include <algorithm>

#include "common/log.h"
#include "membership/coordinator/core.h"

namespace eccl::membership {

std::string CoordinatorCore::statusText() const {
  std::string s;
  if (view.empty()) {
    std::string missing;
    for (uint32_t r = 0; r < nranks; ++r) {
      bool here = false;
      for (auto& [mid, rr] : rankOf) here = here || rr == r;
      if (!here) missing += fmt::format("{}{}", missing.empty() ? "" : ",", r);
    }
    std::string vacant;
    for (auto& [rank, how] : vacantRanks) vacant += fmt::format("{}{} ({})", vacant.empty() ? "" : ", ", rank, how);
    s = fmt::format("forming: {} of {} ranks registered (missing: {}{})\n", rankOf.size(), nranks, missing,
                    vacant.empty() ? "" : "; ended before registering, waiting for a standby: " + vacant);
  } else {
    s = fmt::format("epoch {}, {} ranks\n", epoch, view.size());
  }
  for (size_t r = 0; r < view.size(); ++r) {
    auto it = members.find(view[r]);
    if (it == members.end() || isFailed(view[r])) {
      s += fmt::format("  rank {}: member {:016x} FAILED{}\n", r, view[r],
                       it == members.end() ? "" : fmt::format(" (pid {})", it->second.pid));
      continue;
    }
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - it->second.lastHeard).count();
    s += fmt::format("  rank {}: member {:016x} at {} pid {} healthy (heard {} ms ago)\n", r, view[r],
                     it->second.address, it->second.pid, ms);
  }
  for (auto& [mid, m] : members)
    if (m.role == Role::kStandby)
      s += fmt::format("  standby: member {:016x} at {} pid {}{}{}{}\n", mid, m.address, m.pid,
                       m.eager ? " (eager)" : "", m.reserved ? " (reserved for a replacement)" : "",
                       m.retired ? " (retired: its migration was aborted)" : "");
  if (pending)
    s += fmt::format("  preparing epoch {}: {} ({} of {} prepared{})\n", pending->epoch, pending->story,
                     pending->prepared.size(), pending->next.size(),
                     pending->voting ? fmt::format(", voting: {} yes, {} gave up, {} lost", pending->votedYes.size(),
                                                   pending->gaveUp.size(), pending->lost.size())
                                     : "");
  for (auto& [asker, ask] : reconfigureAsks)
    s += fmt::format("  reconfiguration {:016x} asked by {} for {}\n", ask.uuid, label(asker),
                     describeMembers(ask.members));
  if (replaceHeldUntil)
    s += fmt::format(
        "  REPLACE held for {} failed rank(s): {} standby(s) reserved, {} ms left to wait for more\n", failed.size(),
        idleStandbys(true).size(),
        std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(*replaceHeldUntil - now).count()));
  for (uint64_t pid : fencedPids_) s += fmt::format("  fenced: pid {}\n", pid);
  if (!lastAbort.empty()) s += fmt::format("  last aborted reconfiguration: {}\n", lastAbort);
  if (!lastFailure.empty()) s += fmt::format("  last failure: {}\n", lastFailure);
  return s;
}

StatusPids parseStatusPids(const std::string& status) {
  StatusPids pids;
  size_t start = 0;
  while (start < status.size()) {
    size_t end = status.find('\n', start);
    if (end == std::string::npos) end = status.size();
    const std::string_view line(status.data() + start, end - start);
    start = end + 1;
    const bool rank = line.starts_with("  rank "), standby = line.starts_with("  standby: "),
               fenced = line.starts_with("  fenced: ");
    size_t at = line.find("pid ");
    if ((!rank && !standby && !fenced) || at == std::string_view::npos) continue;
    uint64_t pid = 0;
    for (at += 4; at < line.size() && line[at] >= '0' && line[at] <= '9'; ++at) pid = pid * 10 + (line[at] - '0');
    if (fenced) pids.fenced.insert(pid);
    else if (rank) pids.view.insert(pid);
    else if (line.find("(reserved") == std::string_view::npos) pids.idleStandbys.insert(pid);
  }
  return pids;
}

}  // namespace eccl::membership
