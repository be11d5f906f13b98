#include "elastic/delta.h"

#include <algorithm>

#include "coll/algorithms.h"

namespace eccl::elastic {

namespace {
bool contains(const std::vector<MemberId>& v, MemberId m) { return std::find(v.begin(), v.end(), m) != v.end(); }
}  // namespace

DeltaPlan planDelta(const std::vector<MemberId>& before, const std::vector<MemberId>& after, MemberId self,
                    int selfRank) {
  DeltaPlan plan;
  for (MemberId m : before)
    if (m != self && !contains(after, m)) plan.close.push_back(m);
  for (MemberId m : after) {
    if (m == self) continue;
    (contains(before, m) ? plan.keep : plan.add).push_back(m);
  }
  for (int peer : coll::latencyPeers(selfRank, static_cast<int>(after.size())))
    plan.connect.push_back(after[static_cast<size_t>(peer)]);
  return plan;
}

}  // namespace eccl::elastic
