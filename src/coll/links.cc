#include "coll/links.h"

#include "common/error.h"

namespace eccl::coll {

void Links::readPeer(int peer, uint64_t, void*, size_t) {
  fail(ecclInternalError, "these links cannot read rank {}'s memory", peer);
}

void Links::exchange(int peer, uint32_t tag, const void* from, size_t sendBytes, void* into, size_t recvBytes) {
  RequestPtr requests[2];
  requests[0] = irecv(peer, tag, into, recvBytes);
  requests[1] = isend(peer, tag, from, sendBytes);
  waitAll(requests);
}

void Links::exchangeAndUse(int peer, uint32_t tag, const void* from, size_t sendBytes, uint8_t* scratch,
                           size_t recvBytes, FunctionRef<void(const uint8_t*)> use) {
  exchange(peer, tag, from, sendBytes, scratch, recvBytes);
  use(scratch);
}

}  // namespace eccl::coll
