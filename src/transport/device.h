// The device: one endpoint of one communicator over the back ends it was
// given (backend.h). It owns all policy; back ends only move bytes.
// Threads and ownership:
//  - the progress thread runs an epoll loop over every lane's descriptor
//    and an eventfd; it does all reads and the writes a caller could not
//    finish;
//  - the accept thread accepts and authenticates incoming lanes on every
//    back end's listener, then hands each to the loop's table;
//  - with peers from connections (the NCCL plugin), a dial thread per
//    member being connected dials, authenticates and installs its lanes, so
//    no caller waits for a connection; a communicator's caller dials inline;
//  - caller threads post sends and receives; a send is written inline when
//    the lane has room (saving a thread hop for small messages), the rest
//    is left to the loop;
//  - a caller waiting on a request takes the lanes over from the loop (all
//    of them, by silencing one nested epoll set) and reads and writes them
//    itself, spinning for a short while before it sleeps in poll(): a
//    wake-up of the progress thread plus a condition-variable hand-off cost
//    tens of microseconds per message on a busy machine. The loop takes the
//    lanes back once no caller has driven them for a short lease.
//    Shared-memory lanes are looked at on every pass (memory, no system
//    call) and armed before anyone sleeps, so their doorbells wake it.
// Every lane and all matching state are guarded by one device mutex, so a
// buffer is never touched after its request has completed or failed.
// Lock order: device mutex, then nothing (onPeerFailure must only record).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/crypto.h"
#include "membership/handshake.h"
#include "transport/transport.h"

namespace eccl::transport {

struct DeviceOptions {
  MemberId self = 0;
  uint64_t jobId = 0;
  uint64_t commId = 0;
  Secret secret{};
  int lanes = 2;
  int64_t stripeMinBytes = 256 << 10;
  int64_t handshakeTimeoutMs = 5000;
  bool pinProgressThread = true;
  // A caller's unlocked copy of this many bytes on a peer with several
  // lanes wakes the progress thread to copy the others beside it (0: never).
  int64_t copyHelpBytes = 0;
  int64_t spinUs = 0;  // how long a waiting caller polls before it sleeps
  // How long it goes on polling while an RDMA transfer of its own is in
  // flight (a completion is due: sleeping on the completion channel costs
  // an interrupt and a wake-up per completion, as in NCCL's proxy thread).
  int64_t rdmaPollUs = 0;
  // The back ends to use (backend.h), in the order a dial tries them; the
  // first that reaches a member carries all its lanes, and a member none
  // reaches fails. Empty: every registered one (ECCL_TRANSPORT=auto), where
  // one that cannot start here is left out unless it is required.
  std::vector<std::string> backends;
  std::string ifname;         // ECCL_SOCKET_IFNAME syntax
  size_t ringBytes = 1 << 20;  // for back ends that buffer in memory, per lane and direction
  size_t shmZeroCopyBytes = 0;  // shared memory: chunks from this size are written once (0: never)
  bool shmUnlockedWrites = false;  // and without the device lock (ECCL_SHM_UNLOCKED_WRITES)
  bool shmPeerReads = true;        // shared memory: peers' memory may be read (ECCL_SHM_PEER_READS)
  // The secret an incoming lane must prove, by the job id its hello names;
  // unset: `secret`, for `jobId` only.
  membership::SecretLookup acceptSecrets;
  // Peers come from connections rather than from a membership (a consumer
  // addressed by handles, the NCCL plugin): whoever holds the other's
  // address dials it, whatever the ids; a member that dials in unannounced
  // becomes a candidate peer filed under Device::inboundPeer(member)
  // (onPeerArrived), so its lanes never mix with the ones dialed to it.
  // Every peer is a candidate: a failure fails only that peer's requests.
  bool peersFromConnections = false;
  // Large chunks over a back end that writes into the peer's memory go by
  // rendezvous straight between the buffers (Conduit::zeroCopyMinBytes).
  // Off for a consumer that cancels requests in flight (a cancelled receive
  // being written into has its connection closed).
  bool zeroCopy = true;
  // A collective's posted receive is announced to its sender, which writes
  // large chunks into it without asking (device_receive_ready.cc).
  bool announceReceives = true;
  // A lane with no foreground send posted for this long lets bulk frames
  // (Device::isendBulk) fill its conduit: only the first message of the
  // next burst waits behind them. A busy lane takes bulk a little at a time.
  int64_t bulkQuietAfterMs = 2;
};

std::unique_ptr<Device> createDevice(const DeviceOptions& options);

}  // namespace eccl::transport
