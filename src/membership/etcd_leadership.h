// Leadership among a job's coordinators, held through an etcd lease: the
// leader key (`<prefix>leader`) exists while its holder's lease lives and
// names the holder. Every write the leader makes is a transaction whose
// first compare is "the leader key still names me under my lease", so a
// leader that lost its lease (it stalled, or lost etcd) can never write
// again even if it does not know yet; there is no window in which two
// coordinators can both change the job's state.
//
// A leader also stops believing it leads on its own clock: its lease is
// known to last at least until (when it last sent a renewal) + TTL, and
// leading() turns false at 9/10 of that unless a renewal got through. A
// leader cut off from etcd therefore stops acting before etcd can let
// another candidate in: members never hear two leaders.
//
// Threads: one owner thread drives an instance (campaign, renew, write);
// holder() and the client's calls are safe from others.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "membership/etcd_client.h"

namespace eccl::membership {

class EtcdLeadership {
 public:
  // `candidate` names this coordinator (its address, for members to find
  // it); `ttlSeconds` bounds how long a dead leader holds the key.
  EtcdLeadership(EtcdClient& etcd, std::string prefix, std::string candidate, int64_t ttlSeconds);

  // One attempt to lead: takes the leader key if nobody holds it. Returns
  // whether this candidate leads now (also true if it already did).
  bool campaign();
  // Refreshes the lease; returns leading(). An expired lease loses
  // leadership (campaign() starts over with a new lease); etcd out of reach
  // keeps it only until the lease's known lower bound runs out (lastError()
  // says why). Call a few times per TTL.
  bool renew();
  bool leading() const;
  // When leading() turns false unless a renewal gets through first.
  std::chrono::steady_clock::time_point leadingUntil() const { return validUntil_; }
  const std::string& lastError() const { return lastError_; }
  // Gives up leadership at once (deletes the key with the lease); with etcd
  // out of reach it stops believing it leads and the lease runs out.
  void resign();

  // Applies `writes` only while this candidate still holds the leader key
  // under its current lease, with `extra` compares; false (nothing
  // written, and leading() turns false if the leader key moved) otherwise.
  bool writeIfLeading(const std::vector<EtcdWrite>& writes, const std::vector<EtcdCompare>& extra = {});

  // Who leads now, as the candidate string it registered; empty if nobody.
  std::string holder();

 private:
  // The compares of "the leader key names this candidate under its lease".
  std::vector<EtcdCompare> heldByMe() const;

  EtcdClient& etcd_;
  const std::string leaderKey_;
  const std::string candidate_;
  const int64_t ttlSeconds_;
  int64_t lease_ = 0;
  bool leading_ = false;
  std::chrono::steady_clock::time_point validUntil_{};
  std::string lastError_;
};

}  // namespace eccl::membership
