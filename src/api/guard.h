// The single translation point between eccl's internal errors and the C
// ABI: every extern "C" entry point runs its body through guarded(), which
// catches everything, records the message and returns a result code.
#pragma once

#include <memory>

#include <exception>
#include <new>
#include <string>

#include "common/error.h"
#include "common/log.h"
#include "core/communicator.h"

namespace eccl::gpu {
class StreamProxy;
}
namespace eccl::snapshot {
class Snapshots;
}
struct ecclComm {
  eccl::Communicator* impl = nullptr;
  // Peer-memory snapshots (snapshot_api.cc); created by
  // ecclSnapshotConfigure, stopped before the communicator goes.
  std::unique_ptr<eccl::snapshot::Snapshots> snapshots;
  // Stream-ordered work on device buffers (stream_calls.h); created on the
  // first such call, destroyed (drained) before the communicator.
  std::unique_ptr<eccl::gpu::StreamProxy> streams;
  ~ecclComm();
};

namespace eccl::moe {
class DispatchPlan;
}
namespace eccl::api {
struct DeviceDispatch;
}
struct ecclMoePlan {
  eccl::Communicator* comm = nullptr;
  std::unique_ptr<eccl::moe::DispatchPlan> impl;  // a dispatch on host buffers
  std::shared_ptr<eccl::api::DeviceDispatch> device;  // one on device buffers (moe_api.cc)
  ~ecclMoePlan();
};

// A non-blocking send or receive (p2p_api.cc).
struct ecclRequest {
  ecclComm_t comm = nullptr;
  eccl::transport::RequestPtr request;
  int peer = -1;
  bool isSend = false;
  bool finished = false;
  ecclResult_t code = ecclSuccess;
  std::string error;
};

namespace eccl::api {

void recordError(ecclComm_t comm, const std::string& message);

// Lets the communicator's stream work run (stream_calls.cc): the stream
// proxy holds the caller role while it runs an op.
void afterStreamWork(ecclComm_t comm);

// The way an entry point comes to hold the caller role
// (common/caller_role.h): the stream work queued before it runs first, so
// the proxy and the application never use the per-call state at once and
// every rank sees one order of calls. clang's thread-safety analysis
// rejects an entry point that uses that state without one. The calls that
// must not wait for the streams (abort, revoke, the async error) use no
// per-call state.
class ECCL_SCOPED_CAPABILITY Entered {
 public:
  Entered(ecclComm_t comm, CallerRole& role) ECCL_ACQUIRE(role) : role_(role) {
    afterStreamWork(comm);
    role_.take();
  }
  ~Entered() ECCL_RELEASE() { role_.give(); }
  Entered(const Entered&) = delete;
  Entered& operator=(const Entered&) = delete;

 private:
  CallerRole& role_;
};

inline Communicator& impl(ecclComm_t comm, const char* fn) {
  if (!comm || !comm->impl) fail(ecclInvalidArgument, "{}: comm is NULL", fn);
  return *comm->impl;
}

template <typename F>
ecclResult_t guarded(ecclComm_t comm, const char* function, F&& body) noexcept {
  try {
    body();
    return ecclSuccess;
  } catch (const Error& e) {
    recordError(comm, e.what());
    return e.code();
  } catch (const std::bad_alloc&) {
    recordError(comm, std::string(function) + ": out of memory");
    return ecclSystemError;
  } catch (const std::exception& e) {
    recordError(comm, std::string(function) + ": internal error: " + e.what());
    return ecclInternalError;
  } catch (...) {
    recordError(comm, std::string(function) + ": internal error: unknown exception");
    return ecclInternalError;
  }
}

}  // namespace eccl::api
