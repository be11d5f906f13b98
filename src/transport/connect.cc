#include "transport/connect.h"

#include <algorithm>
#include <optional>

#include "common/error.h"

namespace eccl::transport {

void connectAll(Device& device, std::vector<MemberId> peers, Deadline deadline) {
  const MemberId self = device.self();
  std::stable_partition(peers.begin(), peers.end(), [self](MemberId m) { return self < m; });
  std::optional<Error> first;
  for (MemberId m : peers) {
    if (m == self) continue;
    try {
      device.connectNow(m, deadline);
    } catch (const Error& e) {
      if (!first) first = e;
    }
  }
  if (first) throw *first;
}

}  // namespace eccl::transport
