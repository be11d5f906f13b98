// A back end that injects faults: it wraps tcp or shm (registered as
// "fault-tcp" and "fault-shm" through transport::registerBackend, so a
// device or a communicator uses it by name, ECCL_TRANSPORT=fault-tcp) and
// follows a script of rules on the frames each member writes: after N
// frames, close the lane, stall it, answer EAGAIN, report an error, write
// one byte at a time, flip a byte of a header or a payload, or swap two
// frames; on every lane of a member, on its lanes to one peer, or on one
// lane index. The paths
// between "peer alive" and "peer dead" are then driven on purpose, in one
// process, deterministically (tests/unit/fault_test.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "transport/device.h"
#include "transport/transport.h"

namespace eccl::test {

enum class FaultKind {
  kClose,        // the lane breaks (writes and reads fail from then on)
  kStall,        // nothing fits for forMs, then writes go on
  kAgain,        // writes fail with EAGAIN for forMs
  kError,        // writes fail with an error the back end names
  kOneByte,      // one byte per write for forMs
  kFlipHeader,   // one byte of the frame's header flipped
  kFlipPayload,  // one byte of the frame's payload flipped (the next frame that has one)
  kReorder,      // the frame held back and written after the next one (or after forMs with no next one)
};
const char* faultName(FaultKind kind);

constexpr transport::MemberId kAnyMember = ~transport::MemberId{0};

struct FaultRule {
  transport::MemberId member = kAnyMember;  // whose writes (the writing device's self)
  int afterFrames = 0;                      // frames this lane writes, from now, before the fault
  FaultKind kind = FaultKind::kClose;
  int forMs = 0;                            // stall, again, one byte; reorder: the longest hold
  int times = 1;                            // lanes it strikes
  transport::MemberId peer = kAnyMember;    // only lanes to this member
  int lane = -1;                            // only this lane index (-1: any)
};

// The options of a device over `backend` (registered first) on loopback,
// with small rings, as the tests' device pairs use them; self is 0.
transport::DeviceOptions faultDeviceOptions(const std::string& backend, int lanes, uint64_t jobId);
// Bytes that differ from one message (seed) to the next.
std::vector<uint8_t> patternBytes(size_t bytes, uint32_t seed);

// Registers fault-tcp and fault-shm once per process; they behave as tcp
// and shm until a rule strikes.
void registerFaultBackends();
// Adds a rule (any thread): every lane of the member counts its frames
// from the moment it first writes after this call.
void addFault(const FaultRule& rule);
// Drops every rule not yet used up (and allowZeroCopy); lanes in a fault
// stay in it.
void clearFaults();
// How many times rules struck since the process started.
int faultsStruck();
// How many reorder rules put their frame behind the next one.
int framesSwapped();

// The next `times` reads of at least `atLeastBytes` on `member`'s lanes
// (payloads read straight into their receive) sleep `ms` first, outside
// every lock of the lane: what other threads do while the device copies
// without its lock is then seen on purpose. clearFaults drops them.
void addSlowRead(transport::MemberId member, size_t atLeastBytes, int ms, int times = 1);
// The same for `member`'s zero-copy writes (Conduit::writeZeroCopy: shared
// memory's process_vm_writev, on lanes opened while allowZeroCopy held).
void addSlowZeroCopyWrite(transport::MemberId member, int ms, int times = 1);
// Lanes opened from now on pass zero-copy through to the inner back end
// (DeviceOptions::shmZeroCopyBytes decides its size); by default they do
// not, so every byte goes through write(), where the rules see it.
void allowZeroCopy(bool on);
// Such reads (and writes) begun (asleep or copying) and ended so far.
int slowReadsBegun();
int slowReadsEnded();

}  // namespace eccl::test
