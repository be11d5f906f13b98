// The MoE dispatch and combine on host or device buffers. On device
// buffers the dispatch is stream-ordered like a collective: the call
// enqueues the copies of x, topkIds (and replicas, when on the device) and
// returns; the proxy thread runs the host dispatch when the stream gets
// there. How many rows arrive is known only then, so ecclMoeExpertInput
// waits for it (as any MoE library must before the caller can size its
// expert work) and copies the rows to device memory on the dispatch's
// stream; ecclMoeCombine is stream-ordered again.
#include <algorithm>

#include "api/guard.h"
#include "api/stream_calls.h"
#include "common/mutex.h"
#include "common/params.h"
#include "core/group.h"
#include "moe/dispatcher.h"

using eccl::Communicator;
using eccl::fail;
using eccl::api::Entered;
using eccl::api::guarded;
using eccl::api::impl;

namespace eccl::api {

// What a dispatch on device buffers shares between the caller and the
// proxy thread, which builds the plan.
struct DeviceDispatch {
  Mutex mu;
  CondVar cv;
  bool done ECCL_GUARDED_BY(mu) = false;
  std::optional<Error> failure ECCL_GUARDED_BY(mu);
  std::unique_ptr<moe::DispatchPlan> plan ECCL_GUARDED_BY(mu);
  gpu::CUstream stream = nullptr;  // rows are copied and freed on it
  gpu::CUdeviceptr rows ECCL_GUARDED_BY(mu) = 0;
  bool rowsOnDevice ECCL_GUARDED_BY(mu) = false;
  // Other streams a combine read from: the rows are freed after their work too.
  std::vector<gpu::CUstream> readOn ECCL_GUARDED_BY(mu);

  void finish(std::unique_ptr<moe::DispatchPlan> built, std::optional<Error> error) {
    MutexLock lock(mu);
    plan = std::move(built);
    failure = std::move(error);
    done = true;
    cv.notifyAll();
  }

  // The plan once the proxy thread has built it; throws its failure, or at the deadline.
  moe::DispatchPlan& ready(const char* fn) ECCL_REQUIRES(mu) {
    const Deadline deadline = deadlineAfterMs(params::timeoutMs());
    while (!done)
      if (!cv.waitUntil(mu, deadline) && Clock::now() >= deadline)
        fail(ecclTimeout, "{}: the dispatch on device buffers has not run before the deadline (is its stream stuck?)",
             fn);
    if (failure) throw Error(failure->code(), fmt::format("{}: the dispatch failed: {}", fn, failure->what()));
    return *plan;
  }
};

}  // namespace eccl::api

ecclMoePlan::~ecclMoePlan() {
  if (!device) return;
  eccl::MutexLock lock(device->mu);
  if (!device->rowsOnDevice || !device->rows) return;
  // Stream-ordered: the rows go once the work enqueued on the dispatch's stream so far is done.
  if (const eccl::gpu::CudaDriver* cuda = eccl::gpu::cudaDriver()) {
    eccl::gpu::StreamContext context(*cuda, device->stream);
    try {
      for (eccl::gpu::CUstream other : device->readOn) cuda->streamAfter(device->stream, other);
    } catch (const eccl::Error& e) {
      // Freeing now could pull the rows from under a combine still reading them.
      eccl::log::warn("ecclMoePlanDestroy: the device rows are kept: {}", e.what());
      return;
    }
    cuda->memFreeAsync(device->rows, device->stream);
  }
}

namespace {

using eccl::api::DeviceDispatch;
using Ins = std::vector<const uint8_t*>;
using Outs = std::vector<uint8_t*>;

int sizeOf(Communicator& c) {
  eccl::SharedCallerTurn peek(c.callerRole());  // the proxy never changes it
  return c.size();
}

void checkNotGrouped(const char* fn) {
  if (eccl::group::active())
    fail(ecclInvalidUsage, "{}: not inside ecclGroupStart/ecclGroupEnd (it is a group of exchanges already)", fn);
}

void dispatchOnDevice(ecclComm_t comm, Communicator& c, eccl::gpu::CUstream stream, const void* x,
                      const int32_t* topkIds, int64_t numTokens, int topk, int64_t hidden, ecclDataType_t type,
                      const int32_t* replicas, int numExperts, ecclMoePlan_t* plan) {
  const size_t rowBytes =
      eccl::moe::DispatchPlan::checkArguments(x, topkIds, numTokens, topk, hidden, type, replicas, numExperts);
  const size_t tokens = static_cast<size_t>(numTokens);
  Communicator::checkedBytes(tokens, type, static_cast<size_t>(hidden), "ecclMoeDispatch x");
  Communicator::checkedBytes(tokens, ecclInt32, static_cast<size_t>(topk), "ecclMoeDispatch topkIds");
  const size_t tableBytes =
      Communicator::checkedBytes(static_cast<size_t>(numExperts), ecclInt32, static_cast<size_t>(sizeOf(c)),
                                 "ecclMoeDispatch replicas");
  auto state = std::make_shared<DeviceDispatch>();
  state->stream = stream;
  // The placement table may live on either side: on the host it is read now.
  const bool tableOnHost = !eccl::gpu::isDeviceMemory(replicas);
  eccl::api::submit(
      comm, stream,
      {{x, tokens * rowBytes}, {topkIds, tokens * topk * sizeof(int32_t)}, {replicas, tableBytes, tableOnHost}}, {},
      [state, &c, numTokens, topk, hidden, type, numExperts](const Ins& in, const Outs&) {
        eccl::CallerTurn turn(c.callerRole());  // the proxy's, while it runs this
        try {
          state->finish(std::make_unique<eccl::moe::DispatchPlan>(
                            c, in[0], reinterpret_cast<const int32_t*>(in[1]), numTokens, topk, hidden, type,
                            reinterpret_cast<const int32_t*>(in[2]), numExperts),
                        std::nullopt);
        } catch (const eccl::Error& e) {
          state->finish(nullptr, e);
          throw;
        } catch (const std::exception& e) {  // whatever it was, the caller waiting for the plan must hear of it
          state->finish(nullptr, eccl::Error(ecclInternalError, e.what()));
          throw;
        }
      },
      "ecclMoeDispatch");
  auto p = std::make_unique<ecclMoePlan>();
  p->comm = &c;
  p->device = std::move(state);
  *plan = p.release();
}

// The plan's sizes once the proxy thread has built it; the stream joins
// those the rows are freed after.
eccl::moe::DispatchPlan& readyFor(DeviceDispatch& state, eccl::gpu::CUstream stream, const char* fn)
    ECCL_REQUIRES(state.mu) {
  eccl::moe::DispatchPlan& d = state.ready(fn);
  if (stream != state.stream && std::find(state.readOn.begin(), state.readOn.end(), stream) == state.readOn.end())
    state.readOn.push_back(stream);
  return d;
}

eccl::moe::DispatchPlan* builtPlan(DeviceDispatch& state) {
  eccl::MutexLock lock(state.mu);
  return state.plan.get();
}

void combineOnDevice(ecclComm_t comm, Communicator& c, eccl::gpu::CUstream stream,
                     const std::shared_ptr<DeviceDispatch>& state, const void* expertOutput, const float* weights,
                     void* out) {
  size_t rowsBytes = 0, weightBytes = 0, outBytes = 0;
  {
    eccl::MutexLock lock(state->mu);
    eccl::moe::DispatchPlan& d = readyFor(*state, stream, "ecclMoeCombine");
    eccl::SharedCallerTurn peek(c.callerRole());
    d.checkCombine(c, expertOutput, weights, out);
    rowsBytes = static_cast<size_t>(d.rowsReceived()) * d.rowBytes();
    const size_t choices = static_cast<size_t>(d.tokens()) * d.topk();
    weightBytes = choices * sizeof(float);
    outBytes = (weights ? static_cast<size_t>(d.tokens()) : choices) * d.rowBytes();
  }
  std::vector<eccl::gpu::StreamProxy::Input> ins{{expertOutput, rowsBytes}};
  if (weights) ins.push_back({weights, weightBytes});
  eccl::api::submit(
      comm, stream, std::move(ins), {{out, outBytes}},
      [&c, state](const Ins& in, const Outs& o) {
        eccl::CallerTurn turn(c.callerRole());  // the proxy's, while it runs this
        builtPlan(*state)->combine(c, in[0], in.size() > 1 ? reinterpret_cast<const float*>(in[1]) : nullptr, o[0]);
      },
      "ecclMoeCombine");
}

void dispatchAlongOnDevice(ecclComm_t comm, Communicator& c, eccl::gpu::CUstream stream,
                           const std::shared_ptr<DeviceDispatch>& state, const void* rows, bool perChoice,
                           void* expertRows) {
  size_t inBytes = 0, outBytes = 0;
  {
    eccl::MutexLock lock(state->mu);
    eccl::moe::DispatchPlan& d = readyFor(*state, stream, "ecclMoeDispatchAlong");
    eccl::SharedCallerTurn peek(c.callerRole());
    d.checkAlong(c, rows, expertRows);
    inBytes = static_cast<size_t>(d.tokens()) * (perChoice ? d.topk() : 1) * d.rowBytes();
    outBytes = static_cast<size_t>(d.rowsReceived()) * d.rowBytes();
  }
  eccl::api::submit(
      comm, stream, {{rows, inBytes}}, {{expertRows, outBytes}},
      [&c, state, perChoice](const Ins& in, const Outs& o) {
        eccl::CallerTurn turn(c.callerRole());  // the proxy's, while it runs this
        builtPlan(*state)->dispatchAlong(c, in[0], perChoice, o[0]);
      },
      "ecclMoeDispatchAlong");
}

// The checks common to the calls that follow a dispatch; the stream when
// their buffers are on the device (as the dispatch's were).
std::optional<eccl::gpu::CUstream> followingCall(ecclMoePlan_t plan, ecclComm_t comm, Communicator& c,
                                                 ecclStream_t stream, std::initializer_list<const void*> buffers,
                                                 const char* fn) {
  if (!plan) fail(ecclInvalidArgument, "{}: plan is NULL", fn);
  if (plan->comm != &c) fail(ecclInvalidArgument, "{}: the plan belongs to another communicator", fn);
  checkNotGrouped(fn);
  {
    eccl::SharedCallerTurn peek(c.callerRole());
    c.checkUsable();
  }
  auto s = eccl::api::deviceStream(comm, stream, buffers, fn);
  if (s.has_value() != (plan->device != nullptr))
    fail(ecclInvalidArgument, "{}: the dispatch took {} buffers and this call {}; use one kind", fn,
         plan->device ? "device" : "host", s ? "device" : "host");
  return s;
}

}  // namespace

extern "C" {

ecclResult_t ecclMoeDispatch(const void* x, const int32_t* topkIds, int64_t numTokens, int topk, int64_t hidden,
                             ecclDataType_t datatype, const int32_t* replicas, int numExperts, ecclMoePlan_t* plan,
                             ecclComm_t comm, ecclStream_t stream) {
  return guarded(comm, "ecclMoeDispatch", [&] {
    Communicator& c = impl(comm, "ecclMoeDispatch");
    if (!plan) fail(ecclInvalidArgument, "ecclMoeDispatch: plan is NULL");
    *plan = nullptr;
    checkNotGrouped("ecclMoeDispatch");
    {
      eccl::SharedCallerTurn peek(c.callerRole());
      c.checkUsable();
    }
    if (auto s = eccl::api::deviceStream(comm, stream, {x, topkIds}, "ecclMoeDispatch")) {
      dispatchOnDevice(comm, c, *s, x, topkIds, numTokens, topk, hidden, datatype, replicas, numExperts, plan);
      return;
    }
    Entered entered(comm, c.callerRole());
    auto p = std::make_unique<ecclMoePlan>();
    p->comm = &c;
    p->impl = std::make_unique<eccl::moe::DispatchPlan>(c, x, topkIds, numTokens, topk, hidden, datatype, replicas,
                                                        numExperts);
    *plan = p.release();
  });
}

ecclResult_t ecclMoeExpertInput(ecclMoePlan_t plan, void** rows, int* numLocalExperts, const int32_t** localExperts,
                                const int64_t** expertRows, const int64_t** expertOffsets) {
  return guarded(nullptr, "ecclMoeExpertInput", [&] {
    if (!plan || !rows || !numLocalExperts || !localExperts || !expertRows || !expertOffsets)
      fail(ecclInvalidArgument, "ecclMoeExpertInput: NULL argument");
    eccl::moe::DispatchPlan* d = plan->impl.get();
    if (plan->device) {
      DeviceDispatch& state = *plan->device;
      eccl::MutexLock lock(state.mu);
      d = &state.ready("ecclMoeExpertInput");
      const size_t bytes = static_cast<size_t>(d->rowsReceived()) * d->rowBytes();
      if (!state.rowsOnDevice && bytes > 0) {
        std::string why;
        const eccl::gpu::CudaDriver* cuda = eccl::gpu::cudaDriver(&why);
        if (!cuda) fail(ecclSystemError, "ecclMoeExpertInput: {}", why);
        eccl::gpu::StreamContext context(*cuda, state.stream);
        cuda->check(cuda->memAllocAsync(&state.rows, bytes, state.stream), "ecclMoeExpertInput: allocating the rows");
        eccl::gpu::CUresult copied = cuda->memcpyHtoDAsync(state.rows, d->expertInput(), bytes, state.stream);
        if (copied != 0) {
          cuda->memFreeAsync(state.rows, state.stream);
          state.rows = 0;
          cuda->check(copied, "ecclMoeExpertInput: copying the rows to the device");
        }
      }
      state.rowsOnDevice = true;
      *rows = reinterpret_cast<void*>(state.rows);
    } else {
      *rows = d->expertInput();
    }
    *numLocalExperts = static_cast<int>(d->localExperts().size());
    *localExperts = d->localExperts().data();
    *expertRows = d->expertRows().data();
    *expertOffsets = d->expertOffsets().data();
  });
}

ecclResult_t ecclMoeCombine(ecclMoePlan_t plan, const void* expertOutput, const float* weights, void* out,
                            ecclComm_t comm, ecclStream_t stream) {
  return guarded(comm, "ecclMoeCombine", [&] {
    Communicator& c = impl(comm, "ecclMoeCombine");
    auto s = followingCall(plan, comm, c, stream, {expertOutput, weights, out}, "ecclMoeCombine");
    if (s)
      combineOnDevice(comm, c, *s, plan->device, expertOutput, weights, out);
    else {
      Entered entered(comm, c.callerRole());
      plan->impl->combine(c, expertOutput, weights, out);
    }
  });
}

ecclResult_t ecclMoeDispatchAlong(ecclMoePlan_t plan, const void* rows, int perChoice, void* expertRows,
                                  ecclComm_t comm, ecclStream_t stream) {
  return guarded(comm, "ecclMoeDispatchAlong", [&] {
    Communicator& c = impl(comm, "ecclMoeDispatchAlong");
    if (perChoice != 0 && perChoice != 1)
      fail(ecclInvalidArgument, "ecclMoeDispatchAlong: perChoice is {}, not 0 or 1", perChoice);
    auto s = followingCall(plan, comm, c, stream, {rows, expertRows}, "ecclMoeDispatchAlong");
    if (s)
      dispatchAlongOnDevice(comm, c, *s, plan->device, rows, perChoice == 1, expertRows);
    else {
      Entered entered(comm, c.callerRole());
      plan->impl->dispatchAlong(c, rows, perChoice == 1, expertRows);
    }
  });
}

ecclResult_t ecclMoePlanGetStats(ecclMoePlan_t plan, ecclMoePlanStats_t* stats) {
  return guarded(nullptr, "ecclMoePlanGetStats", [&] {
    if (!plan || !stats) fail(ecclInvalidArgument, "ecclMoePlanGetStats: NULL argument");
    auto fill = [stats](const eccl::moe::DispatchPlan& d) {
      stats->rowsKept = d.rowsKept();
      stats->rowsSent = d.rowsSent() - stats->rowsKept;
      stats->rowsReceived = d.rowsReceived() - stats->rowsKept;
    };
    if (plan->device) {
      DeviceDispatch& state = *plan->device;
      eccl::MutexLock lock(state.mu);
      fill(state.ready("ecclMoePlanGetStats"));
    } else {
      fill(*plan->impl);
    }
  });
}

ecclResult_t ecclMoePlanDestroy(ecclMoePlan_t plan) {
  return guarded(nullptr, "ecclMoePlanDestroy", [&] { delete plan; });
}

}  // extern "C"
