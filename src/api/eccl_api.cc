// One thin shim per entry point: check arguments, call the core, and let
// guarded() turn any error into a result code.
#include <algorithm>
#include <cstring>

#include "api/guard.h"
#include "api/stream_calls.h"
#include "membership/coordinator.h"
#include "membership/unique_id.h"
#include "coll/reduce.h"
#include "common/params.h"
#include "core/group.h"
#include "snapshot/snapshots.h"

using eccl::CallerTurn;
using eccl::Communicator;
using eccl::fail;
using eccl::api::guarded;

namespace eccl::api {
namespace {
thread_local std::string threadLastError;
}

void recordError(ecclComm_t comm, const std::string& message) {
  threadLastError = message;
  if (comm && comm->impl) comm->impl->setLastError(message);
  log::info("{}", message);
}

}  // namespace eccl::api

namespace {

using eccl::api::impl;

using eccl::api::Entered;
using eccl::api::deviceStream;
using eccl::api::submit;
using eccl::api::submitElementwise;
using Ins = std::vector<const uint8_t*>;
using Outs = std::vector<uint8_t*>;

void checkStream(ecclStream_t stream, const char* fn) {
  if (stream != nullptr)
    fail(ecclInvalidArgument,
         "{}: stream must be NULL: this call works on host buffers only (device buffers and streams are taken by the "
         "collectives, send/recv and the MoE dispatch and combine)",
         fn);
}

// A collective outside a group runs now; inside one it runs at GroupEnd.
// `f` takes the caller role itself (a CallerTurn): it runs where the role
// is held, now in this entry point or on the stream proxy's thread, or at
// GroupEnd on the thread that called this.
template <typename F>
void runOrEnqueue(Communicator& c, F&& f) ECCL_REQUIRES(c.callerRole()) {
  if (eccl::group::active())
    eccl::group::enqueue(&c, nullptr, std::forward<F>(f));
  else
    f();
}

// A collective's argument checks at its entry point: a refusal still takes
// the op's number and tells the other ranks (Communicator::refuseCollective),
// in this rank's call order (inside a group, where the op would have run).
template <typename Checks>
auto refusingAtEntry(ecclComm_t comm, Communicator& c, Checks&& checks) {
  try {
    return checks();
  } catch (const eccl::Error& e) {
    if (e.code() == ecclInvalidArgument) {
      Entered entered(comm, c.callerRole());
      runOrEnqueue(c, [&c, why = std::string(e.what())] {
        CallerTurn turn(c.callerRole());
        c.refuseCollective(why);
      });
    }
    throw;
  }
}

// A send or receive on host memory: now, or posted at GroupEnd inside a group.
void sendOnHost(Communicator& c, const void* buf, size_t bytes, int peer, ecclDataType_t type)
    ECCL_REQUIRES(c.callerRole()) {
  if (peer == c.rank()) {
    eccl::group::enqueue(&c, [=, &c] { CallerTurn turn(c.callerRole()); c.pushSelfSend(buf, bytes); }, nullptr);
    return;
  }
  if (!eccl::group::active()) {
    c.waitP2p(c.postSend(buf, bytes, peer, type), peer, true);
    return;
  }
  auto request = std::make_shared<eccl::transport::RequestPtr>();
  eccl::group::enqueue(
      &c, [=, &c] { CallerTurn turn(c.callerRole()); *request = c.postSend(buf, bytes, peer, type); },
      [=, &c] { CallerTurn turn(c.callerRole()); c.waitP2p(*request, peer, true); });
}

void recvOnHost(Communicator& c, void* buf, size_t bytes, int peer, ecclDataType_t type)
    ECCL_REQUIRES(c.callerRole()) {
  if (peer == c.rank()) {
    eccl::group::enqueue(&c, nullptr, [=, &c] { CallerTurn turn(c.callerRole()); c.popSelfRecv(buf, bytes); });
    return;
  }
  if (!eccl::group::active()) {
    c.waitP2p(c.postRecv(buf, bytes, peer, type), peer, false);
    return;
  }
  auto request = std::make_shared<eccl::transport::RequestPtr>();
  eccl::group::enqueue(
      &c, [=, &c] { CallerTurn turn(c.callerRole()); *request = c.postRecv(buf, bytes, peer, type); },
      [=, &c] { CallerTurn turn(c.callerRole()); c.waitP2p(*request, peer, false); },
      /*postFirst=*/true);
}

// This rank and the group's size, read without waiting for the stream
// work: the proxy never changes them.
struct Shape {
  int rank, size;
};
Shape shapeOf(Communicator& c) {
  eccl::SharedCallerTurn peek(c.callerRole());
  return {c.rank(), c.size()};
}

// Send and receive buffers that overlap give wrong results in every
// algorithm (a ring reads what it already overwrote); in place, NCCL's
// one allowed overlap, is the same pointer, or for allgather and
// reducescatter this rank's block of the larger buffer.
void checkOverlap(const void* in, size_t inBytes, const void* out, size_t outBytes, bool inPlace, const char* fn) {
  if (!in || !out || inBytes == 0 || outBytes == 0 || inPlace) return;
  const auto i = reinterpret_cast<uintptr_t>(in), o = reinterpret_cast<uintptr_t>(out);
  if (i < o + outBytes && o < i + inBytes)
    fail(ecclInvalidArgument,
         "{}: sendbuff {} ({} bytes) and recvbuff {} ({} bytes) overlap, and the call is not in place (in place: "
         "sendbuff == recvbuff, or for allgather and reducescatter this rank's block of the larger buffer)",
         fn, in, inBytes, out, outBytes);
}

eccl::CommOptions optionsFrom(const ecclConfig_t* config, const char* what) {
  eccl::CommOptions options;
  if (config) {
    if (config->size < sizeof(size_t) || config->size > (1u << 16))
      fail(ecclInvalidArgument, "{}: config->size={} is not a valid struct size", what, config->size);
    ecclConfig_t c{};
    std::memcpy(&c, config, std::min(config->size, sizeof(c)));
    options.timeoutMs = c.timeoutMs;
    options.socketsPerPeer = c.socketsPerPeer;
  }
  return options;
}

}  // namespace

extern "C" {

ecclResult_t ecclGetVersion(int* version) {
  return guarded(nullptr, "ecclGetVersion", [&] {
    if (!version) fail(ecclInvalidArgument, "ecclGetVersion: version is NULL");
    *version = ECCL_VERSION_CODE;
  });
}

const char* ecclGetErrorString(ecclResult_t r) {
  switch (r) {
    case ecclSuccess: return "no error";
    case ecclInvalidArgument: return "invalid argument";
    case ecclInvalidUsage: return "invalid usage";
    case ecclRemoteError: return "remote process exited or there was a network error";
    case ecclTimeout: return "operation timed out";
    case ecclAuthError: return "authentication failed";
    case ecclSystemError: return "system call or library failed";
    case ecclInternalError: return "internal error in eccl";
    case ecclEvicted: return "this member was declared failed and evicted from the job";
    case ecclLogFull: return "the boundary-send log is full";
    default: return "unknown result code";
  }
}

const char* ecclGetLastError(ecclComm_t comm) {
  if (comm && comm->impl) return comm->impl->lastError();
  return eccl::api::threadLastError.c_str();
}

ecclResult_t ecclGetUniqueId(ecclUniqueId* id) {
  return guarded(nullptr, "ecclGetUniqueId", [&] {
    if (!id) fail(ecclInvalidArgument, "ecclGetUniqueId: uniqueId is NULL");
    *id = eccl::membership::createUniqueId();
  });
}

ecclResult_t ecclUniqueIdToString(const ecclUniqueId* id, char* out, size_t outSize) {
  return guarded(nullptr, "ecclUniqueIdToString", [&] {
    if (!id || !out) fail(ecclInvalidArgument, "ecclUniqueIdToString: NULL argument");
    std::string text = eccl::membership::uniqueIdToText(*id);
    if (outSize < text.size() + 1)
      fail(ecclInvalidArgument, "ecclUniqueIdToString: buffer of {} bytes, need {}", outSize, text.size() + 1);
    std::memcpy(out, text.c_str(), text.size() + 1);
  });
}

ecclResult_t ecclUniqueIdFromString(const char* text, ecclUniqueId* id) {
  return guarded(nullptr, "ecclUniqueIdFromString", [&] {
    if (!id || !text) fail(ecclInvalidArgument, "ecclUniqueIdFromString: NULL argument");
    *id = eccl::membership::uniqueIdFromText(text);
  });
}


ecclResult_t ecclCommInitRankConfig(ecclComm_t* comm, int nranks, ecclUniqueId id, int rank,
                                    const ecclConfig_t* config) {
  return guarded(nullptr, "ecclCommInitRank", [&] {
    if (!comm) fail(ecclInvalidArgument, "ecclCommInitRank: comm is NULL");
    *comm = nullptr;
    eccl::CommOptions options = optionsFrom(config, "ecclCommInitRankConfig");
    auto handle = std::make_unique<ecclComm>();
    handle->impl = new Communicator(nranks, id, rank, options);
    *comm = handle.release();
  });
}

ecclResult_t ecclCommInitRank(ecclComm_t* comm, int nranks, ecclUniqueId id, int rank) {
  return ecclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

ecclResult_t ecclCommInitStandby(ecclComm_t* comm, ecclUniqueId id, const ecclConfig_t* config) {
  return guarded(nullptr, "ecclCommInitStandby", [&] {
    if (!comm) fail(ecclInvalidArgument, "ecclCommInitStandby: comm is NULL");
    *comm = nullptr;
    eccl::CommOptions options = optionsFrom(config, "ecclCommInitStandby");
    auto handle = std::make_unique<ecclComm>();
    handle->impl = new Communicator(id, options, options.timeoutMs);
    *comm = handle.release();
  });
}

ecclResult_t ecclCommRecover(ecclComm_t comm, ecclRecoverPolicy_t policy) {
  return guarded(comm, "ecclCommRecover", [&] {
    Communicator& c = impl(comm, "ecclCommRecover");
    Entered entered(comm, c.callerRole());
    c.recover(policy);
  });
}

ecclResult_t ecclCommSandbox(ecclComm_t comm, int nranks, int rank) {
  return guarded(comm, "ecclCommSandbox", [&] {
    Communicator& c = impl(comm, "ecclCommSandbox");
    Entered entered(comm, c.callerRole());
    c.setSandbox(nranks, rank);
  });
}

ecclResult_t ecclCommSandboxRecord(ecclComm_t comm, int calls) {
  return guarded(comm, "ecclCommSandboxRecord", [&] {
    Communicator& c = impl(comm, "ecclCommSandboxRecord");
    Entered entered(comm, c.callerRole());
    c.recordSandboxCalls(calls);
  });
}

ecclResult_t ecclCommPrepare(ecclComm_t comm, int rank) {
  return guarded(comm, "ecclCommPrepare", [&] {
    Communicator& c = impl(comm, "ecclCommPrepare");
    Entered entered(comm, c.callerRole());
    c.prepareMigration(rank);
  });
}

ecclResult_t ecclCommPrepareStatus(ecclComm_t comm, ecclPrepareState_t* state, int* leavingRank) {
  return guarded(comm, "ecclCommPrepareStatus", [&] {
    Communicator& c = impl(comm, "ecclCommPrepareStatus");
    if (!state) fail(ecclInvalidArgument, "ecclCommPrepareStatus: state is NULL");
    Entered entered(comm, c.callerRole());
    std::string why;
    int leaving = -1;
    *state = c.prepareStatus(&why, &leaving);
    if (leavingRank) *leavingRank = leaving;
    if (*state == ecclPrepareFailed) c.setLastError(why);
  });
}

ecclResult_t ecclCommSwitchover(ecclComm_t comm) {
  return guarded(comm, "ecclCommSwitchover", [&] {
    Communicator& c = impl(comm, "ecclCommSwitchover");
    Entered entered(comm, c.callerRole());
    c.switchover();
  });
}

ecclResult_t ecclCommMemberId(ecclComm_t comm, uint64_t* memberId) {
  return guarded(comm, "ecclCommMemberId", [&] {
    Communicator& c = impl(comm, "ecclCommMemberId");
    if (!memberId) fail(ecclInvalidArgument, "ecclCommMemberId: memberId is NULL");
    *memberId = c.memberId();
  });
}

ecclResult_t ecclCommRegisterStandby(ecclComm_t* comm, ecclUniqueId id, const ecclConfig_t* config) {
  return guarded(nullptr, "ecclCommRegisterStandby", [&] {
    if (!comm) fail(ecclInvalidArgument, "ecclCommRegisterStandby: comm is NULL");
    *comm = nullptr;
    eccl::CommOptions options = optionsFrom(config, "ecclCommRegisterStandby");
    auto handle = std::make_unique<ecclComm>();
    handle->impl = new Communicator(id, options, options.timeoutMs, /*wait=*/false);
    *comm = handle.release();
  });
}

ecclResult_t ecclCommAwaitPromotion(ecclComm_t comm, int64_t timeoutMs) {
  return guarded(comm, "ecclCommAwaitPromotion", [&] {
    Communicator& c = impl(comm, "ecclCommAwaitPromotion");
    Entered entered(comm, c.callerRole());
    c.awaitPromotion(eccl::deadlineAfterMs(timeoutMs > 0 ? timeoutMs : eccl::params::standbyTimeoutMs()));
  });
}

ecclResult_t ecclCommReconfigure(ecclComm_t comm, const uint64_t* members, int count, uint64_t uuid,
                                 int64_t timeoutMs) {
  return guarded(comm, "ecclCommReconfigure", [&] {
    Communicator& c = impl(comm, "ecclCommReconfigure");
    if (!members || count < 1) fail(ecclInvalidArgument, "ecclCommReconfigure: members is NULL or count {} < 1", count);
    Entered entered(comm, c.callerRole());
    c.reconfigure(std::vector<uint64_t>(members, members + count), uuid, timeoutMs);
  });
}

ecclResult_t ecclCommRevoke(ecclComm_t comm) {
  return guarded(nullptr, "ecclCommRevoke", [&] { impl(comm, "ecclCommRevoke").revoke("ecclCommRevoke"); });
}

ecclResult_t ecclCommGrow(ecclComm_t comm, int count) {
  return guarded(comm, "ecclCommGrow", [&] {
    Communicator& c = impl(comm, "ecclCommGrow");
    Entered entered(comm, c.callerRole());
    c.grow(count);
  });
}

ecclResult_t ecclMigrationSend(const void* sendbuff, size_t count, ecclDataType_t datatype, ecclComm_t comm,
                               ecclStream_t stream) {
  return guarded(comm, "ecclMigrationSend", [&] {
    Communicator& c = impl(comm, "ecclMigrationSend");
    checkStream(stream, "ecclMigrationSend");
    Entered entered(comm, c.callerRole());
    size_t bytes = Communicator::checkedBytes(count, datatype, 1, "ecclMigrationSend");
    Communicator::checkBuffer(sendbuff, count, "ecclMigrationSend sendbuff");
    c.migrationSend(sendbuff, bytes);
  });
}

ecclResult_t ecclMigrationRecv(void* recvbuff, size_t count, ecclDataType_t datatype, ecclComm_t comm,
                               ecclStream_t stream) {
  return guarded(comm, "ecclMigrationRecv", [&] {
    Communicator& c = impl(comm, "ecclMigrationRecv");
    checkStream(stream, "ecclMigrationRecv");
    Entered entered(comm, c.callerRole());
    size_t bytes = Communicator::checkedBytes(count, datatype, 1, "ecclMigrationRecv");
    Communicator::checkBuffer(recvbuff, count, "ecclMigrationRecv recvbuff");
    c.migrationRecv(recvbuff, bytes);
  });
}

ecclResult_t ecclLogConfigure(ecclComm_t comm, const ecclLogConfig_t* config) {
  return guarded(comm, "ecclLogConfigure", [&] {
    Communicator& c = impl(comm, "ecclLogConfigure");
    Entered entered(comm, c.callerRole());
    ecclLogConfig_t off{};
    off.size = sizeof(off);
    if (config && (config->size < sizeof(size_t) || config->size > (1u << 16)))
      fail(ecclInvalidArgument, "ecclLogConfigure: config->size={} is not a valid struct size", config->size);
    ecclLogConfig_t cfg{};
    if (config) std::memcpy(&cfg, config, std::min(config->size, sizeof(cfg)));
    c.configureLog(config ? cfg : off);
  });
}

ecclResult_t ecclLogSetTag(ecclComm_t comm, int64_t iteration, int32_t microbatch) {
  // Sends already on a stream are logged under the tag they were issued with.
  return guarded(comm, "ecclLogSetTag", [&] {
    Communicator& c = impl(comm, "ecclLogSetTag");
    Entered entered(comm, c.callerRole());
    c.setLogTag(iteration, microbatch);
  });
}

ecclResult_t ecclLogTruncate(ecclComm_t comm, int64_t iteration) {
  return guarded(comm, "ecclLogTruncate", [&] {
    Communicator& c = impl(comm, "ecclLogTruncate");
    Entered entered(comm, c.callerRole());
    c.truncateLog(iteration);
  });
}

ecclResult_t ecclLogDiscard(ecclComm_t comm, int64_t fromIteration) {
  return guarded(comm, "ecclLogDiscard", [&] {
    Communicator& c = impl(comm, "ecclLogDiscard");
    Entered entered(comm, c.callerRole());
    c.discardLog(fromIteration);
  });
}

ecclResult_t ecclLogStats(ecclComm_t comm, ecclLogStats_t* stats) {
  return guarded(comm, "ecclLogStats", [&] {
    Communicator& c = impl(comm, "ecclLogStats");
    if (!stats || stats->size < sizeof(size_t) || stats->size > (1u << 16))
      fail(ecclInvalidArgument, "ecclLogStats: stats is NULL or stats->size is not a valid struct size");
    Entered entered(comm, c.callerRole());
    c.fillLogStats(stats);
  });
}

ecclResult_t ecclLogReplay(ecclComm_t comm, int peer, int64_t fromIteration, int64_t toIteration) {
  return guarded(comm, "ecclLogReplay", [&] {
    Communicator& c = impl(comm, "ecclLogReplay");
    Entered entered(comm, c.callerRole());
    c.replayLog(peer, fromIteration, toIteration);
  });
}

ecclResult_t ecclLogRead(ecclComm_t comm, int peer, size_t index, ecclLogRecord_t* record, void* buffer,
                         size_t bufferBytes) {
  return guarded(comm, "ecclLogRead", [&] {
    Communicator& c = impl(comm, "ecclLogRead");
    if (!record || record->size < sizeof(size_t) || record->size > (1u << 16))
      fail(ecclInvalidArgument, "ecclLogRead: record is NULL or record->size is not a valid struct size");
    Entered entered(comm, c.callerRole());
    c.readLog(peer, index, record, buffer, bufferBytes);
  });
}

ecclResult_t ecclCommGetStats(ecclComm_t comm, ecclCommStats_t* stats) {
  return guarded(comm, "ecclCommGetStats", [&] {
    Communicator& c = impl(comm, "ecclCommGetStats");
    if (!stats) fail(ecclInvalidArgument, "ecclCommGetStats: stats is NULL");
    if (stats->size < sizeof(size_t) + 8 || stats->size > (1u << 16))
      fail(ecclInvalidArgument, "ecclCommGetStats: stats->size={} is not a valid struct size", stats->size);
    Entered entered(comm, c.callerRole());
    c.fillStats(stats);
  });
}

ecclResult_t ecclCommInitFromEnv(ecclComm_t* comm) {
  ecclUniqueId id;
  int rank = -1, nranks = -1;
  bool standby = false;
  ecclResult_t r = guarded(nullptr, "ecclCommInitFromEnv", [&] {
    std::string text0 = eccl::params::envUniqueId();
    standby = eccl::params::envRole() == "standby";
    if (standby) {
      if (text0.empty()) fail(ecclInvalidUsage, "ecclCommInitFromEnv: ECCL_UNIQUE_ID must be set for a standby");
      id = eccl::membership::uniqueIdFromText(text0);
      return;
    }
    rank = eccl::params::envRank();
    nranks = eccl::params::envNranks();
    std::string text = eccl::params::envUniqueId();
    if (rank < 0 || nranks < 1 || text.empty())
      fail(ecclInvalidUsage, "ecclCommInitFromEnv: ECCL_RANK, ECCL_NRANKS and ECCL_UNIQUE_ID must be set "
                             "(run the program under eccl-run)");
    id = eccl::membership::uniqueIdFromText(text);
  });
  if (r != ecclSuccess) return r;
  if (standby) return ecclCommInitStandby(comm, id, nullptr);
  return ecclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

ecclResult_t ecclCommDestroy(ecclComm_t comm) {
  return guarded(nullptr, "ecclCommDestroy", [&] {
    Communicator& c = impl(comm, "ecclCommDestroy");
    {
      Entered entered(comm, c.callerRole());  // runs what the streams enqueued
      comm->streams.reset();
      comm->snapshots.reset();
      c.destroy();
    }
    delete comm->impl;
    delete comm;
  });
}

ecclResult_t ecclCommAbort(ecclComm_t comm) {
  return guarded(nullptr, "ecclCommAbort", [&] {
    Communicator& c = impl(comm, "ecclCommAbort");
    comm->snapshots.reset();
    c.abort();
    if (comm->streams) comm->streams->abandon();
    comm->streams.reset();
    delete comm->impl;
    delete comm;
  });
}

ecclResult_t ecclCommCount(const ecclComm_t comm, int* count) {
  return guarded(comm, "ecclCommCount", [&] {
    Communicator& c = impl(comm, "ecclCommCount");
    if (!count) fail(ecclInvalidArgument, "ecclCommCount: count is NULL");
    eccl::SharedCallerTurn peek(c.callerRole());  // the proxy never changes the size
    *count = c.size();
  });
}

ecclResult_t ecclCommUserRank(const ecclComm_t comm, int* rank) {
  return guarded(comm, "ecclCommUserRank", [&] {
    Communicator& c = impl(comm, "ecclCommUserRank");
    if (!rank) fail(ecclInvalidArgument, "ecclCommUserRank: rank is NULL");
    eccl::SharedCallerTurn peek(c.callerRole());  // the proxy never changes the rank
    *rank = c.rank();
  });
}

ecclResult_t ecclCommGetAsyncError(ecclComm_t comm, ecclResult_t* asyncError) {
  return guarded(comm, "ecclCommGetAsyncError", [&] {
    Communicator& c = impl(comm, "ecclCommGetAsyncError");
    if (!asyncError) fail(ecclInvalidArgument, "ecclCommGetAsyncError: asyncError is NULL");
    *asyncError = c.asyncError();
    // The reason is the communicator's last error, for ecclGetLastError.
    if (*asyncError != ecclSuccess) c.setLastError(c.asyncErrorMessage());
  });
}

ecclResult_t ecclAllReduce(const void* in, void* out, size_t count, ecclDataType_t type, ecclRedOp_t op,
                           ecclComm_t comm, ecclStream_t stream) {
  return guarded(comm, "ecclAllReduce", [&] {
    Communicator& c = impl(comm, "ecclAllReduce");
    refusingAtEntry(comm, c, [&] {
      const size_t bytes = Communicator::checkedBytes(count, type, 1, "ecclAllReduce");
      checkOverlap(in, bytes, out, bytes, in == out, "ecclAllReduce");
    });
    auto host = [&c, type, op](const void* i, void* o, size_t n) {
      CallerTurn turn(c.callerRole());
      runOrEnqueue(c, [=, &c] {
        CallerTurn turn(c.callerRole());
        c.allReduce(i, o, n, type, op);
      });
    };
    if (auto s = deviceStream(comm, stream, {in, out}, "ecclAllReduce")) {
      submitElementwise(comm, *s, in, out, count, type, host, "ecclAllReduce");
      return;
    }
    Entered entered(comm, c.callerRole());
    host(in, out, count);
  });
}

ecclResult_t ecclBroadcast(const void* in, void* out, size_t count, ecclDataType_t type, int root,
                           ecclComm_t comm, ecclStream_t stream) {
  return guarded(comm, "ecclBroadcast", [&] {
    Communicator& c = impl(comm, "ecclBroadcast");
    const bool atRoot = shapeOf(c).rank == root;
    refusingAtEntry(comm, c, [&] {
      const size_t bytes = Communicator::checkedBytes(count, type, 1, "ecclBroadcast");
      if (atRoot) checkOverlap(in, bytes, out, bytes, in == out, "ecclBroadcast");
    });
    auto host = [&c, type, root](const void* i, void* o, size_t n) {
      CallerTurn turn(c.callerRole());
      runOrEnqueue(c, [=, &c] {
        CallerTurn turn(c.callerRole());
        c.broadcast(i, o, n, type, root);
      });
    };
    if (auto s = deviceStream(comm, stream, {atRoot ? in : nullptr, out}, "ecclBroadcast")) {
      // Off the root only the output is staged, and it is the input as well.
      submitElementwise(comm, *s, atRoot ? in : nullptr, out, count, type,
                        [host](const uint8_t* i, uint8_t* o, size_t n) { host(i ? i : o, o, n); }, "ecclBroadcast");
      return;
    }
    Entered entered(comm, c.callerRole());
    host(in, out, count);
  });
}

ecclResult_t ecclReduce(const void* in, void* out, size_t count, ecclDataType_t type, ecclRedOp_t op, int root,
                        ecclComm_t comm, ecclStream_t stream) {
  return guarded(comm, "ecclReduce", [&] {
    Communicator& c = impl(comm, "ecclReduce");
    const bool atRoot = shapeOf(c).rank == root;
    refusingAtEntry(comm, c, [&] {
      const size_t bytes = Communicator::checkedBytes(count, type, 1, "ecclReduce");
      if (atRoot) checkOverlap(in, bytes, out, bytes, in == out, "ecclReduce");
    });
    auto host = [&c, type, op, root](const void* i, void* o, size_t n) {
      CallerTurn turn(c.callerRole());
      runOrEnqueue(c, [=, &c] {
        CallerTurn turn(c.callerRole());
        c.reduce(i, o, n, type, op, root);
      });
    };
    if (auto s = deviceStream(comm, stream, {in, atRoot ? out : nullptr}, "ecclReduce")) {
      // Off the root the output is scratch: staged, never copied back.
      submitElementwise(comm, *s, in, atRoot ? out : nullptr, count, type, host, "ecclReduce");
      return;
    }
    Entered entered(comm, c.callerRole());
    host(in, out, count);
  });
}

ecclResult_t ecclAllGather(const void* in, void* out, size_t sendcount, ecclDataType_t type, ecclComm_t comm,
                           ecclStream_t stream) {
  return guarded(comm, "ecclAllGather", [&] {
    Communicator& c = impl(comm, "ecclAllGather");
    const Shape shape = shapeOf(c);
    const size_t bytes = refusingAtEntry(comm, c, [&] {
      const size_t bytes = Communicator::checkedBytes(sendcount, type, 1, "ecclAllGather");
      Communicator::checkedBytes(sendcount, type, shape.size, "ecclAllGather");
      checkOverlap(in, bytes, out, bytes * shape.size, in == static_cast<const uint8_t*>(out) + bytes * shape.rank,
                   "ecclAllGather");
      return bytes;
    });
    auto host = [&c, sendcount, type](const void* i, void* o) {
      CallerTurn turn(c.callerRole());
      runOrEnqueue(c, [=, &c] {
        CallerTurn turn(c.callerRole());
        c.allGather(i, o, sendcount, type);
      });
    };
    if (auto s = deviceStream(comm, stream, {in, out}, "ecclAllGather")) {
      submit(comm, *s, {{in, bytes}}, {{out, bytes * shape.size}},
             [host](const Ins& i, const Outs& o) { host(i[0], o[0]); }, "ecclAllGather");
      return;
    }
    Entered entered(comm, c.callerRole());
    host(in, out);
  });
}

ecclResult_t ecclReduceScatter(const void* in, void* out, size_t recvcount, ecclDataType_t type, ecclRedOp_t op,
                               ecclComm_t comm, ecclStream_t stream) {
  return guarded(comm, "ecclReduceScatter", [&] {
    Communicator& c = impl(comm, "ecclReduceScatter");
    const Shape shape = shapeOf(c);
    const size_t bytes = refusingAtEntry(comm, c, [&] {
      const size_t bytes = Communicator::checkedBytes(recvcount, type, 1, "ecclReduceScatter");
      Communicator::checkedBytes(recvcount, type, shape.size, "ecclReduceScatter");
      checkOverlap(in, bytes * shape.size, out, bytes, out == static_cast<const uint8_t*>(in) + bytes * shape.rank,
                   "ecclReduceScatter");
      return bytes;
    });
    auto host = [&c, recvcount, type, op](const void* i, void* o) {
      CallerTurn turn(c.callerRole());
      runOrEnqueue(c, [=, &c] {
        CallerTurn turn(c.callerRole());
        c.reduceScatter(i, o, recvcount, type, op);
      });
    };
    if (auto s = deviceStream(comm, stream, {in, out}, "ecclReduceScatter")) {
      submit(comm, *s, {{in, bytes * shape.size}}, {{out, bytes}},
             [host](const Ins& i, const Outs& o) { host(i[0], o[0]); }, "ecclReduceScatter");
      return;
    }
    Entered entered(comm, c.callerRole());
    host(in, out);
  });
}

ecclResult_t ecclAllToAll(const void* in, void* out, size_t count, ecclDataType_t type, ecclComm_t comm,
                          ecclStream_t stream) {
  return guarded(comm, "ecclAllToAll", [&] {
    Communicator& c = impl(comm, "ecclAllToAll");
    // The same pointer is the core's to refuse: it says in place is not supported.
    const size_t bytes = refusingAtEntry(comm, c, [&] {
      const size_t bytes = Communicator::checkedBytes(count, type, shapeOf(c).size, "ecclAllToAll");
      checkOverlap(in, bytes, out, bytes, in == out, "ecclAllToAll");
      return bytes;
    });
    auto host = [&c, count, type](const void* i, void* o) {
      CallerTurn turn(c.callerRole());
      runOrEnqueue(c, [=, &c] {
        CallerTurn turn(c.callerRole());
        c.allToAll(i, o, count, type);
      });
    };
    if (auto s = deviceStream(comm, stream, {in, out}, "ecclAllToAll")) {
      submit(comm, *s, {{in, bytes}}, {{out, bytes}}, [host](const Ins& i, const Outs& o) { host(i[0], o[0]); },
             "ecclAllToAll");
      return;
    }
    Entered entered(comm, c.callerRole());
    host(in, out);
  });
}

ecclResult_t ecclAllToAllv(const void* in, const size_t sendcounts[], const size_t sdispls[], void* out,
                           const size_t recvcounts[], const size_t rdispls[], ecclDataType_t type,
                           ecclComm_t comm, ecclStream_t stream) {
  return guarded(comm, "ecclAllToAllv", [&] {
    Communicator& c = impl(comm, "ecclAllToAllv");
    if (auto s = deviceStream(comm, stream, {in, out}, "ecclAllToAllv")) {
      const size_t ts = eccl::typeSize(type), n = static_cast<size_t>(shapeOf(c).size);
      size_t inElems = 0, outElems = 0;
      refusingAtEntry(comm, c, [&] {
        if (!sendcounts || !sdispls || !recvcounts || !rdispls)
          fail(ecclInvalidArgument, "ecclAllToAllv: counts and displacements must not be NULL");
        for (size_t r = 0; r < n; ++r) {
          inElems = std::max(inElems, sdispls[r] + sendcounts[r]);
          outElems = std::max(outElems, rdispls[r] + recvcounts[r]);
        }
        Communicator::checkedBytes(std::max(inElems, outElems), type, 1, "ecclAllToAllv");
      });
      // The counts are the caller's arrays: copied now, as the op runs later.
      auto counts = std::make_shared<std::vector<size_t>>(sendcounts, sendcounts + n);
      counts->insert(counts->end(), sdispls, sdispls + n);
      counts->insert(counts->end(), recvcounts, recvcounts + n);
      counts->insert(counts->end(), rdispls, rdispls + n);
      // Each received segment is its own output: only what the op writes
      // goes back, so gaps between segments keep what the device had.
      std::vector<eccl::gpu::StreamProxy::Output> segments;
      for (size_t r = 0; r < n; ++r) segments.push_back({static_cast<uint8_t*>(out) + rdispls[r] * ts, recvcounts[r] * ts});
      submit(comm, *s, {{in, inElems * ts}}, std::move(segments),
             [&c, counts, n, ts, type](const Ins& i, const Outs& o) {
               CallerTurn turn(c.callerRole());
               // Displacements within the staged segments, which start at o[0].
               auto staged = std::make_shared<std::vector<size_t>>(counts->begin(), counts->end());
               for (size_t r = 0; r < n; ++r) (*staged)[3 * n + r] = static_cast<size_t>(o[r] - o[0]) / ts;
               runOrEnqueue(c, [&c, staged, in = i[0], out = o[0], n, type] {
                 CallerTurn turn(c.callerRole());
                 const size_t* k = staged->data();
                 c.allToAllv(in, k, k + n, out, k + 2 * n, k + 3 * n, type);
               });
             },
             "ecclAllToAllv");
      return;
    }
    Entered entered(comm, c.callerRole());
    runOrEnqueue(c, [=, &c] {
      CallerTurn turn(c.callerRole());
      c.allToAllv(in, sendcounts, sdispls, out, recvcounts, rdispls, type);
    });
  });
}

ecclResult_t ecclBarrier(ecclComm_t comm) {
  return guarded(comm, "ecclBarrier", [&] {
    Communicator& c = impl(comm, "ecclBarrier");
    Entered entered(comm, c.callerRole());
    runOrEnqueue(c, [&c] {
      CallerTurn turn(c.callerRole());
      c.barrier();
    });
  });
}

ecclResult_t ecclSend(const void* buf, size_t count, ecclDataType_t type, int peer, ecclComm_t comm,
                      ecclStream_t stream) {
  return guarded(comm, "ecclSend", [&] {
    Communicator& c = impl(comm, "ecclSend");
    size_t bytes = Communicator::checkedBytes(count, type, 1, "ecclSend");
    Communicator::checkBuffer(buf, count, "ecclSend sendbuff");
    const Shape shape = shapeOf(c);
    ECCL_CHECK_ARG(peer >= 0 && peer < shape.size, "ecclSend peer: rank {} is outside [0, {})", peer, shape.size);
    if (peer == shape.rank && !eccl::group::active())
      fail(ecclInvalidUsage, "ecclSend to self (rank {}) outside a group would never complete", peer);
    auto host = [&c, bytes, peer, type](const void* b) {
      CallerTurn turn(c.callerRole());
      sendOnHost(c, b, bytes, peer, type);
    };
    if (auto s = deviceStream(comm, stream, {buf}, "ecclSend")) {
      submit(comm, *s, {{buf, bytes}}, {}, [host](const Ins& i, const Outs&) { host(i[0]); }, "ecclSend");
      return;
    }
    Entered entered(comm, c.callerRole());
    host(buf);
  });
}

ecclResult_t ecclRecv(void* buf, size_t count, ecclDataType_t type, int peer, ecclComm_t comm,
                      ecclStream_t stream) {
  return guarded(comm, "ecclRecv", [&] {
    Communicator& c = impl(comm, "ecclRecv");
    size_t bytes = Communicator::checkedBytes(count, type, 1, "ecclRecv");
    Communicator::checkBuffer(buf, count, "ecclRecv recvbuff");
    const Shape shape = shapeOf(c);
    ECCL_CHECK_ARG(peer >= 0 && peer < shape.size, "ecclRecv peer: rank {} is outside [0, {})", peer, shape.size);
    if (peer == shape.rank && !eccl::group::active())
      fail(ecclInvalidUsage, "ecclRecv from self (rank {}) outside a group would never complete", peer);
    auto host = [&c, bytes, peer, type](void* b) {
      CallerTurn turn(c.callerRole());
      recvOnHost(c, b, bytes, peer, type);
    };
    if (auto s = deviceStream(comm, stream, {buf}, "ecclRecv")) {
      submit(comm, *s, {}, {{buf, bytes}}, [host](const Ins&, const Outs& o) { host(o[0]); }, "ecclRecv");
      return;
    }
    Entered entered(comm, c.callerRole());
    host(buf);
  });
}

ecclResult_t ecclGroupStart(void) {
  return guarded(nullptr, "ecclGroupStart", [] { eccl::group::start(); });
}

ecclResult_t ecclGroupEnd(void) {
  return guarded(nullptr, "ecclGroupEnd", [] {
    // Device calls go to their streams first (enqueueing only); the host
    // calls then run and wait here. Both are tried even when one fails.
    std::optional<eccl::Error> first;
    if (eccl::group::depth() == 1) try {
        eccl::api::flushDeviceGroup();
      } catch (const eccl::Error& e) {
        first = e;
      }
    try {
      eccl::group::end();
    } catch (const eccl::Error& e) {
      if (!first) first = e;
    }
    if (first) throw *first;
  });
}

}  // extern "C"
