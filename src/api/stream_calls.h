// How an entry point decides between the host path and the stream path,
// and the shapes of stream-ordered ops (gpu/stream_proxy.h does the work).
#pragma once

#include <initializer_list>
#include <optional>
#include <vector>

#include "api/guard.h"
#include "gpu/stream_proxy.h"

namespace eccl::api {

// The stream to enqueue on when the call names device buffers (NULL: the
// legacy default stream, as NCCL's stream 0); nullopt for a host call,
// which first lets the communicator's stream work run, so calls keep one
// order on every rank. Throws on host buffers with a stream, on a mix of
// host and device buffers, and on device buffers inside a group.
std::optional<gpu::CUstream> deviceStream(ecclComm_t comm, ecclStream_t stream,
                                          std::initializer_list<const void*> buffers, const char* fn);
gpu::StreamProxy& streams(ecclComm_t comm);

// Element-aligned chunks of ECCL_GPU_CHUNK_BYTES over `bytes`; a side
// without bytes here (a broadcast's non-root input) gets empty ranges.
std::vector<gpu::StreamProxy::Chunk> elementChunks(size_t bytes, size_t elementBytes, bool hasIn, bool hasOut);
// One chunk of the whole buffers.
std::vector<gpu::StreamProxy::Chunk> wholeOp(size_t inBytes, size_t outBytes);

}  // namespace eccl::api
