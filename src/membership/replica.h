// One of a job's replicated coordinators (ecclcoord serve --etcd). The
// replicas campaign for an etcd lease (EtcdLeadership); the leader serves
// the job and writes its durable state to etcd, conditioned on still
// holding the lease, before any member hears of a change. The first leader
// makes the job: its id names every replica registered by then (each
// replica holds an address of its own, on any host, and registers it in
// etcd before campaigning), and goes to etcd. A later leader reads the id
// and the state, starts listening at its own address and takes over:
// members with a failover window (ECCL_COORD_FAILOVER_MS) try the id's
// addresses in turn (replicas that do not lead refuse connections) and
// resume with it, keeping their ids and ranks. A replica that loses the
// lease stops serving at once and campaigns again. A replica whose address
// the job's id does not name can never serve it: it says so and stops.
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "membership/coordinator.h"

namespace eccl::membership {

struct ReplicaOptions {
  std::string etcdEndpoints;           // "IP:port,..."
  std::string prefix = "/eccl/job/";   // the job's keys: <prefix>leader, <prefix>id, <prefix>state, <prefix>replicas/
  int64_t ttlSeconds = 2;              // how long a dead leader holds the lead
  std::string listen;                  // "IP[:port]"; empty: ECCL_SOCKET_IFNAME's address, any port
  int replicas = 1;                    // how many the id names: the first leader waits for them to register
  int64_t registerWaitMs = 30000;      // ... this long at most, then names those it has
  CoordinatorOptions coordinator;
};

// Campaigns, leads, and campaigns again after losing the lead, until
// `stop`. `announce` gets the job's id (text) each time this replica starts
// leading. Throws naming what failed (etcd out of reach for the whole
// call budget is not a failure: it is waited out).
void runReplica(const ReplicaOptions& options, const std::atomic<bool>& stop,
                const std::function<void(const std::string& idText)>& announce);

}  // namespace eccl::membership
