#include "api/stream_calls.h"

#include <algorithm>
#include <map>
#include <set>

#include "coll/reduce.h"
#include "common/params.h"
#include "core/group.h"
#include "snapshot/snapshots.h"

ecclComm::~ecclComm() = default;

namespace eccl::api {
namespace {

// One communicator's device calls in the open group: one op on its proxy
// at GroupEnd, ordered on every stream the calls named.
struct DeviceBatch {
  gpu::CUstream stream = nullptr;
  std::vector<gpu::CUstream> alsoOn;
  std::vector<gpu::StreamProxy::Input> in;
  std::vector<gpu::StreamProxy::Output> out;
  struct Call {
    HostCall host;
    size_t firstIn, numIn, firstOut, numOut;
  };
  std::vector<Call> calls;
  std::string names;
};

struct GroupedCalls {
  std::map<ecclComm_t, DeviceBatch> device;
  std::set<ecclComm_t> host;
};
thread_local GroupedCalls grouped;

void noteGroupKind(ecclComm_t comm, bool device, const char* fn) {
  if (!group::active() || !comm) return;
  const bool other = device ? grouped.host.count(comm) > 0 : grouped.device.count(comm) > 0;
  if (other)
    fail(ecclInvalidUsage,
         "{}: this group already holds {} buffers on this communicator; one group takes either host or device "
         "buffers per communicator (their host parts run at different times)",
         fn, device ? "host" : "device");
  if (!device) grouped.host.insert(comm);
}

// Runs a batch's calls on the proxy thread as one host group, so a ring of
// sends and receives in it cannot deadlock.
void runAsGroup(const std::vector<DeviceBatch::Call>& calls, const std::vector<size_t>& inAt,
                const std::vector<size_t>& outAt, const uint8_t* in, uint8_t* out) {
  std::exception_ptr first;
  group::start();
  for (const auto& call : calls) {
    std::vector<const uint8_t*> ins;
    std::vector<uint8_t*> outs;
    for (size_t i = 0; i < call.numIn; ++i) ins.push_back(in + inAt[call.firstIn + i]);
    for (size_t i = 0; i < call.numOut; ++i) outs.push_back(out + outAt[call.firstOut + i]);
    try {
      call.host(ins, outs);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  // Always closed: this thread's group must not stay open after a failure.
  try {
    group::end();
  } catch (...) {
    if (!first) first = std::current_exception();
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace

std::optional<gpu::CUstream> deviceStream(ecclComm_t comm, ecclStream_t stream,
                                          std::initializer_list<const void*> buffers, const char* fn) {
  // Without a CUDA driver nothing is device memory: one look, not one per
  // buffer (a tenth of an 8 B host allreduce's instructions went here).
  const bool driver = gpu::cudaDriver() != nullptr;
  size_t device = 0, given = 0;
  for (const void* b : buffers) {
    if (!b) continue;
    ++given;
    if (driver) device += gpu::isDeviceMemory(b);
  }
  if (device == 0) {
    if (stream != nullptr)
      fail(ecclInvalidArgument,
           "{}: a stream was given but the buffers are host memory (host buffers take a NULL stream; device buffers "
           "take a stream, or NULL for the default stream)",
           fn);
    noteGroupKind(comm, false, fn);
    return std::nullopt;
  }
  if (device != given)
    fail(ecclInvalidArgument, "{}: some buffers are device memory and some host memory; pass one kind", fn);
  noteGroupKind(comm, true, fn);
  // CU_STREAM_LEGACY: NCCL's stream 0 is the legacy default stream.
  return stream ? static_cast<gpu::CUstream>(stream) : reinterpret_cast<gpu::CUstream>(uintptr_t{1});
}

void afterStreamWork(ecclComm_t comm) {
  if (comm && comm->streams) comm->streams->drain(deadlineAfterMs(params::timeoutMs()));
}

gpu::StreamProxy& streams(ecclComm_t comm) {
  if (!comm->streams) comm->streams = std::make_unique<gpu::StreamProxy>(*comm->impl);
  return *comm->streams;
}

void submit(ecclComm_t comm, gpu::CUstream stream, std::vector<gpu::StreamProxy::Input> in,
            std::vector<gpu::StreamProxy::Output> out, HostCall host, const char* fn) {
  if (group::active()) {
    streams(comm);  // a missing CUDA driver is this call's error, not GroupEnd's
    DeviceBatch& batch = grouped.device[comm];
    if (batch.calls.empty()) batch.stream = stream;
    if (stream != batch.stream && std::find(batch.alsoOn.begin(), batch.alsoOn.end(), stream) == batch.alsoOn.end())
      batch.alsoOn.push_back(stream);
    batch.calls.push_back({std::move(host), batch.in.size(), in.size(), batch.out.size(), out.size()});
    batch.in.insert(batch.in.end(), in.begin(), in.end());
    batch.out.insert(batch.out.end(), out.begin(), out.end());
    batch.names += (batch.names.empty() ? "" : ", ") + std::string(fn);
    return;
  }
  const auto inAt = gpu::StreamProxy::packedOffsets(gpu::StreamProxy::sizesOf(in));
  const auto outAt = gpu::StreamProxy::packedOffsets(gpu::StreamProxy::sizesOf(out));
  gpu::StreamProxy::Op op;
  op.inputs = std::move(in);
  op.outputs = std::move(out);
  op.what = fn;
  op.run = [host = std::move(host), inAt, outAt, numIn = op.inputs.size(), numOut = op.outputs.size()](
               const uint8_t* i, uint8_t* o, size_t) {
    std::vector<const uint8_t*> ins;
    std::vector<uint8_t*> outs;
    for (size_t k = 0; k < numIn; ++k) ins.push_back(i + inAt[k]);
    for (size_t k = 0; k < numOut; ++k) outs.push_back(o + outAt[k]);
    host(ins, outs);
  };
  streams(comm).enqueue(stream, std::move(op));
}

void submitElementwise(ecclComm_t comm, gpu::CUstream stream, const void* in, void* out, size_t count,
                       ecclDataType_t type, std::function<void(const uint8_t*, uint8_t*, size_t)> host,
                       const char* fn) {
  const size_t ts = typeSize(type), bytes = count * ts;
  std::vector<gpu::StreamProxy::Input> ins;
  if (in) ins.push_back({in, bytes});
  std::vector<gpu::StreamProxy::Output> outs{{out, bytes}};
  if (group::active()) {
    submit(comm, stream, std::move(ins), std::move(outs),
           [host = std::move(host), count](const std::vector<const uint8_t*>& i, const std::vector<uint8_t*>& o) {
             host(i.empty() ? nullptr : i[0], o[0], count);
           },
           fn);
    return;
  }
  // Element-aligned chunks; one buffer per side, so packed offsets are the buffers' own.
  const size_t step = std::max(ts, gpu::StreamProxy::chunkBytes() / ts * ts);
  gpu::StreamProxy::Op op;
  std::vector<size_t> counts;
  size_t offset = 0;
  do {
    size_t n = std::min(step, bytes - offset);
    op.chunks.push_back({offset, in ? n : 0, offset, n});
    counts.push_back(n / ts);
    offset += n;
  } while (offset < bytes);
  op.inputs = std::move(ins);
  op.outputs = std::move(outs);
  op.what = fn;
  op.run = [host = std::move(host), counts, hasIn = in != nullptr](const uint8_t* i, uint8_t* o, size_t index) {
    host(hasIn ? i : nullptr, o, counts[index]);
  };
  streams(comm).enqueue(stream, std::move(op));
}

void flushDeviceGroup() {
  GroupedCalls calls = std::move(grouped);
  grouped = GroupedCalls{};
  std::optional<Error> first;
  for (auto& [comm, batch] : calls.device) {
    try {
      const auto inAt = gpu::StreamProxy::packedOffsets(gpu::StreamProxy::sizesOf(batch.in));
      const auto outAt = gpu::StreamProxy::packedOffsets(gpu::StreamProxy::sizesOf(batch.out));
      gpu::StreamProxy::Op op;
      op.inputs = std::move(batch.in);
      op.outputs = std::move(batch.out);
      op.alsoOn = std::move(batch.alsoOn);
      op.what = "ecclGroupEnd (" + batch.names + ")";
      op.run = [calls = std::move(batch.calls), inAt, outAt](const uint8_t* i, uint8_t* o, size_t) {
        runAsGroup(calls, inAt, outAt, i, o);
      };
      streams(comm).enqueue(batch.stream, std::move(op));
    } catch (const Error& e) {
      if (comm->impl) comm->impl->setLastError(e.what());
      if (!first) first = e;
    }
  }
  if (first) throw *first;
}

}  // namespace eccl::api
