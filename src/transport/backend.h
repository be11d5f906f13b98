// How a back end reaches members, and how back ends come to exist. The
// device is created with a list of back-end names and never names one
// itself: it asks each for its address, dials through the first that
// reaches a member, and accepts on every listener. A back end is its own
// folder (tcp/, shm/) holding a `backendSpec()`; the build's list of
// back ends (ECCL_TRANSPORT_BACKENDS in src/CMakeLists.txt) registers it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/socket.h"
#include "transport/conduit.h"

namespace eccl::transport {

// Hardware objects a back end made for lanes, counted since it started:
// what a reconfiguration's statistics report beside the lanes (over verbs
// a lane owns one queue pair; the socket back ends make none).
struct BackendCounters {
  uint64_t queuePairsCreated = 0;
  uint64_t queuePairsDestroyed = 0;
  uint64_t completionQueuesOpen = 0;
  uint64_t registrationsReused = 0;  // zero-copy buffers found registered already
  // Shared memory's single copy (process_vm_writev): lanes that may write
  // into their peer, lanes the kernel refused it, bytes moved that way.
  uint64_t singleCopyLanes = 0;
  uint64_t singleCopyRefused = 0;
  uint64_t singleCopyBytes = 0;
  uint64_t peerReadLanes = 0;  // shared memory: lanes whose peer's memory this process may read
};

// What every back end is created with; each uses what applies to it.
struct BackendOptions {
  uint64_t jobId = 0;
  MemberId self = 0;
  std::string ifname;  // network interfaces to use (ECCL_SOCKET_IFNAME syntax)
  // Bytes per lane and direction for back ends that carry data through a
  // buffer in memory (a shared-memory ring).
  size_t ringBytes = 1 << 20;
  // Shared memory: chunks of at least this many bytes are written once,
  // into the receiver's buffer (0: always through the ring).
  size_t shmZeroCopyBytes = 0;
  // Those writes run without the device lock (Conduit::writesZeroCopyBesideCalls).
  bool shmUnlockedWrites = false;
  // Shared memory: whether this process may try to read its peers' memory
  // (transport/peer_memory.h).
  bool shmPeerReads = true;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  // This back end's part of the member's address: what a peer's back end
  // of the same name dials. Opaque to everyone else.
  virtual std::string address() const = 0;
  // Says where it listens, for the device's start-up log line.
  virtual std::string describe() const = 0;
  // The listening descriptor the device's accept thread polls.
  virtual int listenFd() const = 0;
  // Moves the calling thread (the device's progress thread) near the
  // hardware this back end drives; false if it has none to be near.
  virtual bool placeThread() { return false; }
  // Read by the device's stats() from any thread.
  virtual BackendCounters counters() const { return {}; }
  // Whether a member whose address has `part` for this back end is
  // listening where this process could open such a lane to it without
  // dialing (shared memory: its socket in this network namespace). Both
  // ends of a pair get the same answer. False for back ends that reach
  // other hosts.
  virtual bool listensHere(const std::string& part) const { return false; }
  // A connected, blocking stream to `member` at `address` (this back end's
  // part of the member's address), or an empty Fd when this back end cannot
  // reach it (shared memory: another host or network namespace). Throws
  // when it can reach the member but connecting fails.
  virtual Fd dial(MemberId member, const std::string& address, Deadline deadline, const std::string& what,
                  const std::function<bool()>& giveUp) = 0;
  // Accepts one pending stream (the listener was readable); empty Fd if none.
  virtual Fd accept(std::string* from) = 0;
  // After authentication, each end turns its stream into the lane's conduit
  // (shared memory: the dialer creates the rings and passes them over).
  virtual std::unique_ptr<Conduit> openDialed(Fd stream, Deadline deadline, const std::string& what) = 0;
  virtual std::unique_ptr<Conduit> openAccepted(Fd stream, Deadline deadline, const std::string& what) = 0;
};

struct BackendSpec {
  const char* name;
  // Whether it can reach a member on another host: the first such entry of
  // an address is the one people read (displayAddress).
  bool reachesOtherHosts;
  std::unique_ptr<Backend> (*create)(const BackendOptions& options);
  // In the default list, one that cannot start here (no RDMA device) is
  // left out quietly even though it reaches other hosts: another does too.
  bool needsHardware = false;
  // Used only where named (ECCL_TRANSPORT, DeviceOptions::backends), never
  // in the default list: a test's own back end (registerBackend).
  bool onlyByName = false;
};

// Every back end this build has, in the order a dial tries them, then any
// this process registered.
const std::vector<BackendSpec>& registeredBackends();
// Adds a back end after the build's, by a name none has: the extension
// point a test's fault-injecting back end (tests/support/fault_backend.h)
// comes in by, so production code has no test branches. Call it before
// any device exists (the registry is read without a lock).
void registerBackend(const BackendSpec& spec);
// The registered names, comma-separated ("shm,tcp"): for error messages.
std::string registeredBackendNames();
// Parses ECCL_TRANSPORT's syntax: "auto" (every registered back end) or a
// comma-separated list of registered names; throws ecclInvalidArgument.
std::vector<std::string> parseBackendList(const std::string& spec);

// A member's address is every back end's part, "name:part" joined by ','
// ("shm:eccl-1f2e...,tcp:10.0.0.2:4711"), so membership carries it as one
// opaque string.
std::string joinAddress(const std::vector<std::pair<std::string, std::string>>& parts);
std::vector<std::pair<std::string, std::string>> splitAddress(const std::string& address);
// The part of an address people recognise a member by (its network address
// where it has one), for labels and logs.
std::string displayAddress(const std::string& address);

}  // namespace eccl::transport
