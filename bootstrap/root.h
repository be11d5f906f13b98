// The rendezvous root: collects every rank's data address and hands the
// full table back. It runs on a detached thread of the process that created
// the unique id and ends when the table is out or the deadline passes.
#pragma once

#include <string>
#include <vector>

#include "bootstrap/unique_id.h"
#include "common/socket.h"

namespace eccl::bootstrap {

void startRoot(const UniqueIdData& id, Fd listenFd);

// Client side: registers (rank, nranks, dataAddress) with the root and
// returns every rank's data address, indexed by rank.
std::vector<std::string> exchangeAddresses(const UniqueIdData& id, int rank, int nranks,
                                           const std::string& dataAddress, Deadline deadline);

}  // namespace eccl::bootstrap
