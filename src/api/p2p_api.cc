// Non-blocking point-to-point: post now, test or wait later. A caller that
// runs several kinds of work on one thread (the PyTorch backend) keeps a
// receive pending without blocking the collectives it issues after it.
#include "api/guard.h"
#include "api/stream_calls.h"
#include "core/group.h"

using eccl::Communicator;
using eccl::fail;
using eccl::api::Entered;
using eccl::api::guarded;
using eccl::api::impl;

namespace {

// Sends and receives are matched in issue order per peer, like ecclSend/ecclRecv.
void post(ecclComm_t comm, const char* fn, const void* buf, size_t count, ecclDataType_t type, int peer, bool isSend,
          ecclRequest_t* request) {
  Communicator& c = impl(comm, fn);
  if (!request) fail(ecclInvalidArgument, "{}: request is NULL", fn);
  *request = nullptr;
  size_t bytes = Communicator::checkedBytes(count, type, 1, fn);
  Communicator::checkBuffer(buf, count, isSend ? "sendbuff" : "recvbuff");
  if (eccl::gpu::isDeviceMemory(buf))
    fail(ecclInvalidArgument, "{}: the buffer is device memory; {} takes host buffers (ecclSend/ecclRecv take device "
                              "buffers with a stream)", fn, fn);
  if (eccl::group::active()) fail(ecclInvalidUsage, "{}: not inside ecclGroupStart/ecclGroupEnd (use ecclSend/ecclRecv)", fn);
  Entered entered(comm, c.callerRole());
  c.checkRank(peer, fn);
  if (peer == c.rank()) fail(ecclInvalidUsage, "{}: rank {} cannot post to itself", fn, peer);
  auto r = std::make_unique<ecclRequest>();
  r->comm = comm;
  r->peer = peer;
  r->isSend = isSend;
  r->request = isSend ? c.postSend(buf, bytes, peer, type) : c.postRecv(const_cast<void*>(buf), bytes, peer, type);
  *request = r.release();
}

// Records the outcome once; later calls return it again.
template <typename F>
ecclResult_t settle(ecclRequest_t r, const char* fn, F&& check) {
  if (!r) return guarded(nullptr, fn, [&] { fail(ecclInvalidArgument, "{}: request is NULL", fn); });
  if (r->finished) {
    if (r->code != ecclSuccess) eccl::api::recordError(r->comm, r->error);
    return r->code;
  }
  bool done = false;
  ecclResult_t code = guarded(r->comm, fn, [&] { done = check(); });
  if (code != ecclSuccess || done) {
    r->finished = true;
    r->code = code;
    if (code != ecclSuccess) r->error = ecclGetLastError(r->comm);
  }
  return code;
}

}  // namespace

extern "C" {

ecclResult_t ecclIsend(const void* buf, size_t count, ecclDataType_t type, int peer, ecclComm_t comm,
                       ecclRequest_t* request) {
  return guarded(comm, "ecclIsend", [&] { post(comm, "ecclIsend", buf, count, type, peer, true, request); });
}

ecclResult_t ecclIrecv(void* buf, size_t count, ecclDataType_t type, int peer, ecclComm_t comm,
                       ecclRequest_t* request) {
  return guarded(comm, "ecclIrecv", [&] { post(comm, "ecclIrecv", buf, count, type, peer, false, request); });
}

ecclResult_t ecclTest(ecclRequest_t request, int* done) {
  if (!done) return guarded(nullptr, "ecclTest", [] { fail(ecclInvalidArgument, "ecclTest: done is NULL"); });
  *done = 0;
  ecclResult_t r = settle(request, "ecclTest", [&] {
    // A recording of sandbox calls (the proxy's too) sees the receive end.
    Communicator& c = impl(request->comm, "ecclTest");
    Entered entered(request->comm, c.callerRole());
    return c.testP2p(request->request, request->peer, request->isSend);
  });
  *done = request && request->finished;
  return r;
}

ecclResult_t ecclWait(ecclRequest_t request) {
  return settle(request, "ecclWait", [&] {
    Communicator& c = impl(request->comm, "ecclWait");
    Entered entered(request->comm, c.callerRole());
    c.waitP2p(request->request, request->peer, request->isSend);
    return true;
  });
}

ecclResult_t ecclIprobe(int* peer, int* arrived, size_t* bytes, ecclComm_t comm) {
  return guarded(comm, "ecclIprobe", [&] {
    Communicator& c = impl(comm, "ecclIprobe");
    if (!peer || !arrived || !bytes) fail(ecclInvalidArgument, "ecclIprobe: peer, arrived and bytes must not be NULL");
    *arrived = 0;
    *bytes = 0;
    // After the stream work: a stream-ordered receive before this probe
    // moves the sequence number the probe looks at.
    Entered entered(comm, c.callerRole());
    if (c.sandboxed()) fail(ecclInvalidUsage, "ecclIprobe: nothing arrives in the sandbox (a standby has no rank yet)");
    if (eccl::group::active()) fail(ecclInvalidUsage, "ecclIprobe: not inside ecclGroupStart/ecclGroupEnd");
    if (*peer != ECCL_ANY_SOURCE) {
      c.checkRank(*peer, "ecclIprobe");
      if (*peer == c.rank()) fail(ecclInvalidUsage, "ecclIprobe: rank {} cannot receive from itself", *peer);
    }
    size_t n = 0;
    const int from = c.probe(*peer, &n);
    if (from < 0) return;
    *peer = from;
    *bytes = n;
    *arrived = 1;
  });
}

ecclResult_t ecclRequestFree(ecclRequest_t request) {
  return guarded(request ? request->comm : nullptr, "ecclRequestFree", [&] {
    if (!request) return;
    if (!request->finished)
      fail(ecclInvalidUsage, "ecclRequestFree: the {} is still pending (its buffer may still be in use); test or wait "
                             "until it completes", request->isSend ? "send" : "receive");
    delete request;
  });
}

}  // extern "C"
