// Opening a set of connections at once, the way every view change does.
#pragma once

#include <vector>

#include "common/clock.h"
#include "transport/transport.h"

namespace eccl::transport {

// The lower member id dials, so everything this member dials goes first,
// then it waits for the connections the others open to it. A peer that
// fails does not stop the rest: a live peer may be waiting for our dial
// (giving up would leave it to its deadline and get a live member declared
// failed), and the links that do open stay for the next view. Throws the
// first failure once every peer is settled.
void connectAll(Device& device, std::vector<MemberId> peers, Deadline deadline);

}  // namespace eccl::transport
