// The delta of a view change, as a value: what one member closes, adds and
// keeps when its view goes from `before` to `after`, and which peers it
// connects before the first collective of the new view. Pure: no device,
// no communicator, so the O(1) promise is tested directly.
#pragma once

#include <vector>

#include "transport/transport.h"

namespace eccl::elastic {

using transport::MemberId;

struct DeltaPlan {
  std::vector<MemberId> close;    // in `before`, gone from `after`: their links close
  std::vector<MemberId> add;      // new in `after`: registered (address known), not yet connected
  std::vector<MemberId> keep;     // in both: their links are inherited untouched
  std::vector<MemberId> connect;  // the new rank's algorithm partners: connected before returning
};

// `self` must be in `after` (rank `selfRank`); `before` may be empty (a
// standby entering its first view). Orders follow the views' rank orders.
DeltaPlan planDelta(const std::vector<MemberId>& before, const std::vector<MemberId>& after, MemberId self,
                    int selfRank);

}  // namespace eccl::elastic
