// What the ranks tell each other when they (re)start snapshots together:
// one fixed-size record per rank, gathered with the communicator's own
// allgather, and a catalog broadcast from the rank that has the newest.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/communicator.h"

namespace eccl::snapshot {

struct RankInfo {
  int32_t replicas = 0;
  uint32_t fresh = 0;      // came as a standby: no state of its own
  int64_t committed = -1;  // newest committed version
  uint64_t generation = 0; // restores this rank took part in
  uint64_t needs = 0;      // restore: copies it must fetch
  uint64_t lost = 0;       // restore: its own names no survivor had
  int64_t viewSize = 0;    // restore: ranks in the view its snapshots follow (0: fresh)
  char host[88] = {};
  std::string hostKey() const { return std::string(host, strnlen(host, sizeof(host))); }
};

inline std::vector<RankInfo> gatherRecords(Communicator& comm, const RankInfo& mine) ECCL_REQUIRES(comm.callerRole()) {
  std::vector<RankInfo> all(static_cast<size_t>(comm.size()));
  comm.allGather(&mine, all.data(), sizeof(RankInfo), ecclUint8);
  return all;
}

inline std::vector<RankInfo> gatherInfo(Communicator& comm, int replicas, bool fresh, int64_t committed,
                                        uint64_t generation, const std::string& hostKey, int viewSize = 0)
    ECCL_REQUIRES(comm.callerRole()) {
  RankInfo mine;
  mine.viewSize = viewSize;
  mine.replicas = replicas;
  mine.fresh = fresh ? 1 : 0;
  mine.committed = committed;
  mine.generation = generation;
  std::memcpy(mine.host, hostKey.data(), std::min(hostKey.size(), sizeof(mine.host) - 1));
  return gatherRecords(comm, mine);
}

// `bytes` from `root` to every rank (size first).
inline void broadcastBytes(Communicator& comm, int root, std::vector<uint8_t>& bytes) ECCL_REQUIRES(comm.callerRole()) {
  uint64_t size = bytes.size();
  comm.broadcast(&size, &size, 1, ecclUint64, root);
  bytes.resize(size);
  if (size) comm.broadcast(bytes.data(), bytes.data(), size, ecclUint8, root);
}

}  // namespace eccl::snapshot
