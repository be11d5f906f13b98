// How an entry point decides between the host path and the stream path,
// and how stream-ordered ops reach the communicator's stream proxy
// (gpu/stream_proxy.h does the work), alone or as a group.
#pragma once

#include <functional>
#include <initializer_list>
#include <optional>
#include <vector>

#include "api/guard.h"
#include "gpu/stream_proxy.h"

namespace eccl::api {

// The stream to enqueue on when the call names device buffers (NULL: the
// legacy default stream, as NCCL's stream 0); nullopt for a host call,
// whose entry point then enters the communicator (api::Entered). Throws
// on host buffers with a stream, on a mix of host and device buffers, and
// on a group that would mix host and device buffers on one communicator.
std::optional<gpu::CUstream> deviceStream(ecclComm_t comm, ecclStream_t stream,
                                          std::initializer_list<const void*> buffers, const char* fn);
gpu::StreamProxy& streams(ecclComm_t comm);

// The entry point's host path, run on pinned copies of its buffers: in[i]
// is input i, out[j] output j, in the order the call listed them.
using HostCall = std::function<void(const std::vector<const uint8_t*>& in, const std::vector<uint8_t*>& out)>;

// Enqueues a call on device buffers: at once outside a group (one chunk),
// at the outermost ecclGroupEnd inside one, where every call of the group
// on this communicator runs on the host as one group.
void submit(ecclComm_t comm, gpu::CUstream stream, std::vector<gpu::StreamProxy::Input> in,
            std::vector<gpu::StreamProxy::Output> out, HostCall host, const char* fn);

// An op over `count` elements that can run as independent pieces (allreduce,
// broadcast, reduce): outside a group it runs as a pipeline of
// ECCL_GPU_CHUNK_BYTES chunks, `host(in, out, n)` being one piece of n
// elements. in/out null: no such side here (a broadcast's non-root input;
// a reduce's non-root output, which is scratch).
void submitElementwise(ecclComm_t comm, gpu::CUstream stream, const void* in, void* out, size_t count,
                       ecclDataType_t type, std::function<void(const uint8_t*, uint8_t*, size_t)> host,
                       const char* fn);

// At the outermost ecclGroupEnd, before the host ops run: enqueues each
// communicator's device calls of the group. Throws the first failure after
// trying them all.
void flushDeviceGroup();

}  // namespace eccl::api
