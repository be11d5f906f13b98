// What an ecclUniqueId carries: the rendezvous root's address, a random
// 128-bit job secret that every connection must prove it knows, and a job id.
#pragma once

#include <cstdint>
#include <string>

#include "common/crypto.h"
#include "common/socket.h"
#include "eccl.h"

namespace eccl::membership {

struct UniqueIdData {
  SockAddr root;
  Secret secret{};
  uint64_t jobId = 0;
};

ecclUniqueId encodeUniqueId(const UniqueIdData& data);
UniqueIdData decodeUniqueId(const ecclUniqueId& id);  // throws on a malformed id
std::string uniqueIdToText(const ecclUniqueId& id);
ecclUniqueId uniqueIdFromText(const std::string& text);  // throws on malformed text


}  // namespace eccl::membership
