#include "common/params.h"

#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/error.h"

namespace eccl::params {

// Never destroyed: a process that exits with a communicator alive runs
// the static destructors while its device threads still read parameters.
const std::vector<Param>& all() {
  static const auto* table = new std::vector<Param>{
      {"ECCL_TIMEOUT_MS", "int", "30000",
       "Deadline for every blocking wait (connect, send, receive, bootstrap), in milliseconds."},
      {"ECCL_NSOCKS_PERPEER", "int", "1",
       "Lanes (TCP sockets, shared-memory ring pairs or RDMA queue pairs) opened to each peer; large messages are striped across "
       "them."},
      {"ECCL_SOCKET_IFNAME", "string", "",
       "Network interface to use (prefix match; ^name excludes). Default: first non-loopback "
       "interface that is up, else loopback."},
      {"ECCL_DEBUG", "string", "WARN",
       "Log level: NONE, WARN, INFO or TRACE (TRACE lines carry CLOCK_MONOTONIC seconds, so the traces of a host's "
       "processes merge by sorting; the RDMA rendezvous steps are traced)."},
      {"ECCL_STRIPE_MIN_BYTES", "int", "262144",
       "Messages at least this large are split across all lanes of a peer."},
      {"ECCL_ALLREDUCE_SMALL_BYTES", "int", "262144",
       "Allreduce messages up to this size use the small-vector algorithm; larger ones use the ring."},
      {"ECCL_ALLREDUCE_SMALL_ALGO", "string", "auto",
       "Small-vector allreduce: tree (binary tree, 2 log2 N hops, at most three partners per rank, "
       "all connected at every view change; at 2 ranks one exchange), doubling (recursive "
       "doubling, log2 N hops, its log2 N partners connect on first use, after every view change "
       "again), halving (reduce-scatter by recursive halving, all-gather by recursive doubling, "
       "the same partners) or auto (where every partner they need is one a view change connects "
       "anyway, as at N <= 4: doubling up to 16 KiB and halving above, at 2 ranks always doubling; tree elsewhere)."},
      {"ECCL_RING_SEGMENT_BYTES", "int", "524288",
       "Pipeline segment of the ring algorithms: reduction of one segment overlaps receiving "
       "the next."},
      {"ECCL_COORD_FAILOVER_MS", "int", "0",
       "When a member loses the coordinator, how long it looks for a successor at the addresses the job's id names "
       "(replicated coordinators: eccl-run --etcd, which sets it, or ecclcoord serve --etcd) before the loss is "
       "final; it resumes with the one that leads, keeping its id and rank. 0: a lost coordinator is final at once."},
      {"ECCL_SPIN_US", "int", "200",
       "How long a caller waiting on a message polls its peer's sockets or slots, yielding the core "
       "between looks, before it sleeps, in microseconds."},
      {"ECCL_CHECK_CALLS", "int", "1",
       "Every message carries its call's signature (collective, type, op, root, count; send/recv: type "
       "and count) and ranks that disagree get ecclInvalidUsage naming both calls. 0 turns the check off."},
      {"ECCL_TRANSPORT", "string", "auto",
       "Back ends of the lanes, in the order a dial tries them: auto (every back end this build has: shared "
       "memory to members on this host in this network namespace, TCP to the rest), or a comma-separated list "
       "of names (tcp; shm: a member not reachable over shared memory fails to connect; shm,tcp is auto)."},
      {"ECCL_NET_POOL_IDLE_MS", "int", "60000",
       "NCCL net plugin: pooled connections to a process that no NCCL comm has used for this long are closed "
       "(a re-created communicator within it reconnects nothing)."},
      {"ECCL_NET_EAGER_BYTES", "int", "32768",
       "NCCL net plugin: sends of at most this many bytes go at once, without waiting for the receiver's "
       "clear-to-send (the receiver copies them from a staging buffer); larger ones go straight into the posted "
       "buffer once it is announced. 0: every send waits for its clear-to-send."},
      {"ECCL_SNAPSHOT_REPLICAS", "int", "1",
       "Peer-memory snapshots: copies of each rank's shards kept on other ranks (ecclSnapshotConfigure's "
       "default)."},
      {"ECCL_SNAPSHOT_INFLIGHT_BYTES", "int", "8388608",
       "Peer-memory snapshots: replication bytes posted at once per rank, so a snapshot never floods the lanes "
       "collectives use."},
      {"ECCL_SANDBOX_RECORD_BYTES", "int", "268435456",
       "Sandboxed warm-up: output bytes a rank keeps of a recording for standbys (ecclCommSandboxRecord; calls past "
       "it are recorded by signature only), and the largest recording a standby takes in."},
      {"ECCL_NET_LOG_BYTES", "int", "0",
       "NCCL net plugin: the boundary-send log's arena (0: no log); sends to the job ranks of ECCL_NET_LOG_RANKS "
       "are copied into it (needs an eccl job; ecclNetLogConfigure does the same from code)."},
      {"ECCL_NET_LOG_RANKS", "string", "",
       "NCCL net plugin: comma-separated job ranks: this process's sends to them are logged."},
      {"ECCL_NET_LOG_WHEN_FULL", "string", "error",
       "NCCL net plugin: a full send log fails the send (error), holds it back until ecclNetLogTruncate (block: "
       "NCCL retries), or drops the oldest records (evict)."},
      {"ECCL_SHM_RING_BYTES", "int", "1048576",
       "Shared-memory ring per lane and direction, a power of two from 4096 to 1 GiB: a pair of members "
       "holds at most 2 x this x ECCL_NSOCKS_PERPEER (2 MiB by default; 8 ranks on a host: 56 MiB in all), "
       "allocated as it is first written."},
      {"ECCL_SHM_FAST_PATH_BYTES", "int", "16384",
       "Shared memory: a collective's messages of at most this many bytes (16384 at most) go through slots "
       "beside the lane, polled by the receiver, instead of as frames through the ring and the device: the "
       "latency of small collectives. 0: every message takes the ring."},
      {"ECCL_SHM_DIRECT_BYTES", "int", "32768",
       "Shared memory: an allreduce of at least twice this many bytes (at 2 ranks 4 times as many), a broadcast "
       "of at least 4 times as many (at 2 ranks this many), an all-gather or reduce-scatter, every rank's part "
       "counted, of at least 4 times as many (at 2 ranks twice), where every rank may read every peer's memory "
       "(process_vm_readv: same user, no seccomp or Yama rule against it; tried once per lane), reads the peers' buffers where they lie: reductions read their "
       "block of each peer's input through a cache-sized buffer, the rest is read from its owner; one copy of "
       "each byte. 0: never."},
      {"ECCL_SHM_PEER_READS", "int", "1",
       "Shared memory: 0 tells this process not to read its peers' memory, as where the kernel forbids it: "
       "collectives that would read their peers' buffers (ECCL_SHM_DIRECT_BYTES) then go through the lanes at "
       "every rank of the view."},
      {"ECCL_SHM_ZERO_COPY_BYTES", "int", "262144",
       "Shared memory: chunks of at least this many bytes are copied once, by the sender straight into the "
       "receiver's buffer (process_vm_writev, where the kernel allows one process to write into the other: same "
       "user, no seccomp or Yama rule against it; tried once per lane), instead of into the ring and out of it. "
       "0: always through the ring."},
      {"ECCL_IB_HCA", "string", "",
       "ibverbs back end: the RDMA device to use, a name with an optional :port (mlx5_0:1); empty: the first "
       "device with an ACTIVE port."},
      {"ECCL_IB_GID_INDEX", "int", "-1",
       "ibverbs back end: the GID index to use; -1 chooses (a RoCE v2 GID with an IPv4 address, then any RoCE v2 "
       "GID that is not link-local, then 0, which InfiniBand uses)."},
      {"ECCL_IB_ZERO_COPY_BYTES", "int", "65536",
       "ibverbs back end: chunks of at least this many bytes go by rendezvous, written by RDMA straight from the "
       "sender's buffer into the receiver's (both registered for that transfer); smaller ones are copied through "
       "the lane's ring. 0: always through the ring."},
      {"ECCL_IB_POLL_US", "int", "1000000",
       "ibverbs back end: how long a caller waiting on a message goes on polling the completion queue, in "
       "microseconds, while an RDMA transfer of its own is in flight (a rendezvous asked, a write posted, its buffer "
       "exposed to the peer), as NCCL's proxy thread and MPI libraries do, before it sleeps on completion events; "
       "polling costs a core meanwhile. 0: sleep after ECCL_SPIN_US like any wait."},
      {"ECCL_IB_ANNOUNCE_RECEIVES", "int", "1",
       "ibverbs back end: a collective's receive posted before its data comes tells the sender where it is, and "
       "the sender writes its large chunks there without asking (a receiver-driven rendezvous, as NCCL's IB "
       "transport keeps a FIFO of posted buffers at the sender). 0: the sender asks for every chunk (header, "
       "clear-to-send, write)."},
      {"ECCL_IB_REGISTRATION_CACHE_BYTES", "int", "0",
       "ibverbs back end: keep the registrations of zero-copy buffers for reuse, up to this many bytes (idle ones "
       "dropped oldest first); 0: register each transfer's buffers for that transfer only. Only for applications "
       "that never free a buffer's memory while eccl may use it again: a kept registration of freed and "
       "reallocated memory names the old pages, and data would go to or come from them."},
      {"ECCL_GPU_CHUNK_BYTES", "int", "4194304",
       "Device-buffer collectives that split (allreduce, broadcast, reduce) run in chunks of this many bytes, so "
       "the device-host copies of one chunk overlap the network transfer of another. Must match on every rank."},
      {"ECCL_CUDA_DRIVER", "string", "libcuda.so.1",
       "The CUDA driver library device buffers are run with. The suite points it at its host emulation "
       "(tests/support/host_cuda) so the stream path runs where there is no GPU."},
      {"ECCL_HANDSHAKE_TIMEOUT_MS", "int", "5000",
       "Deadline for an incoming connection to complete authentication (and, at the coordinator, to send its "
       "first message after it)."},
      {"ECCL_MAX_UNAUTHENTICATED", "int", "128",
       "Connections each listener (the coordinator's, each member's) holds at once before they prove the job "
       "secret; past it the oldest is dropped. Handshakes run side by side, so none of them delays another."},
      {"ECCL_COPY_HELP_BYTES", "int", "-1",
       "A waiting caller that copies at least this many bytes of one lane with the device lock released wakes the "
       "progress thread to copy the peer's other lanes (ECCL_NSOCKS_PERPEER > 1) beside it. 0: never; -1: 262144 "
       "on a machine with at least 8 cores, never on a smaller one (where the ranks use every core already)."},
      {"ECCL_SHM_UNLOCKED_WRITES", "int", "0",
       "1: shared memory's single-copy writes (ECCL_SHM_ZERO_COPY_BYTES) run with the transport's lock released, "
       "so other threads' posts and receives go on beside them; 0: under it. Off by default: 4 ranks on 2 cores "
       "lost 5-10% of busbw at 16-64 MiB with it (docs/performance.md)."},
      {"ECCL_PIN_PROGRESS_THREAD", "int", "1",
       "Bind the progress thread to the NUMA node of the chosen NIC (when hwloc knows it)."},
      {"ECCL_HEARTBEAT_MS", "int", "500",
       "Period of the heartbeats between each member and the membership coordinator."},
      {"ECCL_HEARTBEAT_TIMEOUT_MS", "int", "3000",
       "A member silent for this long is declared failed by the coordinator (and a member "
       "that stops hearing the coordinator for this long reports it)."},
      {"ECCL_REPLACE_WAIT_MS", "int", "0",
       "Coordinator: how long a REPLACE recovery that finds fewer idle standbys than failed ranks is "
       "held, with the idle ones reserved, while more standbys register (0: refused at once). "
       "eccl-run --refill sets it to half of ECCL_TIMEOUT_MS unless it is set."},
      {"ECCL_STANDBY_TIMEOUT_MS", "int", "3600000",
       "How long ecclCommInitStandby waits for promotion before it gives up."},
      {"ECCL_PREPARE", "string", "lazy",
       "Standbys: eager keeps idle data connections to every member open, so promoting one opens "
       "none; lazy opens them when it is promoted."},
      {"ECCL_ROLE", "string", "rank", "rank or standby: which init a launched process should call (set by eccl-run)."},
      {"ECCL_RANK", "int", "-1", "Rank of this process (set by eccl-run)."},
      {"ECCL_NRANKS", "int", "-1", "Number of ranks (set by eccl-run)."},
      {"ECCL_UNIQUE_ID", "string", "", "The job's unique id as text (set by eccl-run)."},
      {"ECCL_HOSTID", "string", "",
       "The failure domain this process shares with others (snapshot copies go to other ones); empty: the host "
       "name and network namespace. eccl-run --ranks-per-host sets it per simulated host. Transports ignore it."},
  };
  return *table;
}

namespace {

const Param& lookup(const char* name) {
  for (const auto& p : all())
    if (std::strcmp(p.name, name) == 0) return p;
  fail(ecclInternalError, "parameter {} is not declared in the registry", name);
}

std::string getString(const char* name) {
  const Param& p = lookup(name);
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string(p.defaultValue);
}

int64_t getInt(const char* name) {
  std::string s = getString(name);
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0')
    fail(ecclInvalidArgument, "environment variable {}='{}' is not an integer", name, s);
  return v;
}

}  // namespace

int64_t timeoutMs() { return getInt("ECCL_TIMEOUT_MS"); }
int64_t heartbeatMs() { return getInt("ECCL_HEARTBEAT_MS"); }
int64_t heartbeatTimeoutMs() { return getInt("ECCL_HEARTBEAT_TIMEOUT_MS"); }
int64_t standbyTimeoutMs() { return getInt("ECCL_STANDBY_TIMEOUT_MS"); }
int64_t replaceWaitMs() { return getInt("ECCL_REPLACE_WAIT_MS"); }
std::string envRole() { return getString("ECCL_ROLE"); }
bool prepareEager() {
  std::string v = getString("ECCL_PREPARE");
  if (v != "eager" && v != "lazy") fail(ecclInvalidArgument, "ECCL_PREPARE='{}' must be eager or lazy", v);
  return v == "eager";
}
int socketsPerPeer() { return static_cast<int>(getInt("ECCL_NSOCKS_PERPEER")); }
std::string socketIfname() { return getString("ECCL_SOCKET_IFNAME"); }
std::string debugLevel() { return getString("ECCL_DEBUG"); }
int64_t stripeMinBytes() { return getInt("ECCL_STRIPE_MIN_BYTES"); }
int64_t smallAllreduceBytes() { return getInt("ECCL_ALLREDUCE_SMALL_BYTES"); }
SmallAllreduce smallAllreduceAlgorithm() {
  std::string v = getString("ECCL_ALLREDUCE_SMALL_ALGO");
  if (v == "tree") return SmallAllreduce::kTree;
  if (v == "doubling") return SmallAllreduce::kDoubling;
  if (v == "halving") return SmallAllreduce::kHalving;
  if (v != "auto") fail(ecclInvalidArgument, "ECCL_ALLREDUCE_SMALL_ALGO='{}' must be auto, tree, doubling or halving", v);
  return SmallAllreduce::kAuto;
}
int64_t ringSegmentBytes() { return getInt("ECCL_RING_SEGMENT_BYTES"); }
int64_t handshakeTimeoutMs() { return getInt("ECCL_HANDSHAKE_TIMEOUT_MS"); }
int64_t maxUnauthenticated() { return getInt("ECCL_MAX_UNAUTHENTICATED"); }
int64_t spinUs() { return getInt("ECCL_SPIN_US"); }
int64_t coordFailoverMs() { return getInt("ECCL_COORD_FAILOVER_MS"); }
int64_t ibPollUs() { return getInt("ECCL_IB_POLL_US"); }
int64_t ibAnnounceReceives() { return getInt("ECCL_IB_ANNOUNCE_RECEIVES"); }
int64_t netPoolIdleMs() { return getInt("ECCL_NET_POOL_IDLE_MS"); }
int64_t netLogBytes() { return getInt("ECCL_NET_LOG_BYTES"); }
int64_t snapshotReplicas() { return getInt("ECCL_SNAPSHOT_REPLICAS"); }
int64_t snapshotInFlightBytes() { return getInt("ECCL_SNAPSHOT_INFLIGHT_BYTES"); }
int64_t sandboxRecordBytes() { return getInt("ECCL_SANDBOX_RECORD_BYTES"); }
int64_t netEagerBytes() { return getInt("ECCL_NET_EAGER_BYTES"); }
std::string ibHca() { return getString("ECCL_IB_HCA"); }
int64_t ibGidIndex() { return getInt("ECCL_IB_GID_INDEX"); }
int64_t ibZeroCopyBytes() { return getInt("ECCL_IB_ZERO_COPY_BYTES"); }
int64_t shmPeerReads() { return getInt("ECCL_SHM_PEER_READS"); }
int64_t shmDirectBytes() { return getInt("ECCL_SHM_DIRECT_BYTES"); }
int64_t shmZeroCopyBytes() { return getInt("ECCL_SHM_ZERO_COPY_BYTES"); }
int64_t shmFastPathBytes() { return getInt("ECCL_SHM_FAST_PATH_BYTES"); }
int64_t ibRegistrationCacheBytes() { return getInt("ECCL_IB_REGISTRATION_CACHE_BYTES"); }
std::string netLogRanks() { return getString("ECCL_NET_LOG_RANKS"); }
std::string netLogWhenFull() { return getString("ECCL_NET_LOG_WHEN_FULL"); }
std::string transport() { return getString("ECCL_TRANSPORT"); }
int64_t gpuChunkBytes() { return getInt("ECCL_GPU_CHUNK_BYTES"); }
std::string cudaDriverLibrary() { return getString("ECCL_CUDA_DRIVER"); }
int64_t shmRingBytes() {
  int64_t v = getInt("ECCL_SHM_RING_BYTES");
  ECCL_CHECK_ARG(v >= 4096 && v <= (int64_t{1} << 30) && (v & (v - 1)) == 0,
                 "ECCL_SHM_RING_BYTES={} must be a power of two from 4096 to 1073741824", v);
  return v;
}
bool checkCalls() { return getInt("ECCL_CHECK_CALLS") != 0; }
int64_t copyHelpBytes() {
  const int64_t v = getInt("ECCL_COPY_HELP_BYTES");
  if (v >= 0) return v;
  return std::thread::hardware_concurrency() >= 8 ? int64_t{256} << 10 : 0;
}
bool shmUnlockedWrites() { return getInt("ECCL_SHM_UNLOCKED_WRITES") != 0; }
int pinProgressThread() { return static_cast<int>(getInt("ECCL_PIN_PROGRESS_THREAD")); }
int envRank() { return static_cast<int>(getInt("ECCL_RANK")); }
int envNranks() { return static_cast<int>(getInt("ECCL_NRANKS")); }
std::string envUniqueId() { return getString("ECCL_UNIQUE_ID"); }
std::string hostId() { return getString("ECCL_HOSTID"); }

}  // namespace eccl::params
