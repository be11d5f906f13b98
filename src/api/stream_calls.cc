#include "api/stream_calls.h"

#include <algorithm>

#include "common/params.h"
#include "core/group.h"

ecclComm::~ecclComm() = default;

namespace eccl::api {

std::optional<gpu::CUstream> deviceStream(ecclComm_t comm, ecclStream_t stream,
                                          std::initializer_list<const void*> buffers, const char* fn) {
  size_t device = 0, given = 0;
  for (const void* b : buffers) {
    if (!b) continue;
    ++given;
    device += gpu::isDeviceMemory(b);
  }
  if (device == 0) {
    if (stream != nullptr)
      fail(ecclInvalidArgument,
           "{}: a stream was given but the buffers are host memory (host buffers take a NULL stream; device buffers "
           "take a stream, or NULL for the default stream)",
           fn);
    if (comm && comm->streams) comm->streams->drain(deadlineAfterMs(params::timeoutMs()));
    return std::nullopt;
  }
  if (device != given)
    fail(ecclInvalidArgument, "{}: some buffers are device memory and some host memory; pass one kind", fn);
  if (group::active())
    fail(ecclInvalidUsage, "{}: device buffers inside ecclGroupStart/ecclGroupEnd are not supported in this release",
         fn);
  // CU_STREAM_LEGACY: NCCL's stream 0 is the legacy default stream.
  return stream ? static_cast<gpu::CUstream>(stream) : reinterpret_cast<gpu::CUstream>(uintptr_t{1});
}

gpu::StreamProxy& streams(ecclComm_t comm) {
  if (!comm->streams) comm->streams = std::make_unique<gpu::StreamProxy>(*comm->impl);
  return *comm->streams;
}

std::vector<gpu::StreamProxy::Chunk> elementChunks(size_t bytes, size_t elementBytes, bool hasIn, bool hasOut) {
  const size_t step = std::max(elementBytes, gpu::StreamProxy::chunkBytes() / elementBytes * elementBytes);
  std::vector<gpu::StreamProxy::Chunk> chunks;
  size_t offset = 0;
  do {
    size_t n = std::min(step, bytes - offset);
    chunks.push_back({offset, hasIn ? n : 0, offset, hasOut ? n : 0});
    offset += n;
  } while (offset < bytes);
  return chunks;
}

std::vector<gpu::StreamProxy::Chunk> wholeOp(size_t inBytes, size_t outBytes) { return {{0, inBytes, 0, outBytes}}; }

}  // namespace eccl::api
