// What an ecclUniqueId carries: the rendezvous root's address, a random
// 128-bit job secret that every connection must prove it knows, a job id,
// and, for a job with replicated coordinators, the addresses of the others
// (replicas on other hosts: a member that loses one tries the next).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/crypto.h"
#include "common/socket.h"
#include "eccl.h"

namespace eccl::membership {

struct UniqueIdData {
  SockAddr root;
  Secret secret{};
  uint64_t jobId = 0;
  std::vector<SockAddr> spares;  // the job's other coordinators, if replicated

  // The root first, then the spares: where a member looks for the job.
  std::vector<SockAddr> coordinators() const;
};

// How many spare addresses fit beside the root: 12 IPv4 or 4 IPv6.
size_t maxSpareCoordinators(int family);

ecclUniqueId encodeUniqueId(const UniqueIdData& data);
UniqueIdData decodeUniqueId(const ecclUniqueId& id);  // throws on a malformed id
std::string uniqueIdToText(const ecclUniqueId& id);
ecclUniqueId uniqueIdFromText(const std::string& text);  // throws on malformed text
}  // namespace eccl::membership
