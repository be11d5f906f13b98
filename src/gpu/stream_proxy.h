// Collectives on device buffers with NCCL's stream semantics, over the
// host collectives. For each op the caller's stream gets, in order:
//   1. device -> pinned host copies of the input, chunk by chunk;
//   2. per chunk, a host function that hands the chunk to this proxy's
//      thread, which runs the host collective on the pinned copy;
//   3. per chunk, a wait on a flag in mapped host memory that the thread
//      raises when that chunk's collective is done, then the pinned ->
//      device copy of its output.
// The call returns once this is enqueued; the stream's later work waits
// for the op, and the op waits for the stream's earlier work. Chunks
// pipeline: while the thread runs chunk i on the network, the stream copies
// chunk i+1 in and chunk i-1 out. Reductions run on the host (the CPU
// reference); the CUDA reduction kernels (kernels/reduce_cuda.h) exist for a
// device-side placement once a GPU can measure which is faster.
//
// An op that fails records the communicator's asynchronous error
// (ecclCommGetAsyncError) and still raises its flag, so no stream waits
// forever; its outputs are then undefined, as NCCL's are.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "core/communicator.h"
#include "gpu/cuda_driver.h"

namespace eccl::gpu {

class StreamProxy {
 public:
  // One part of an op that runs as its own host collective: its input and
  // output byte ranges within the op's buffers.
  struct Chunk {
    size_t inOffset = 0, inBytes = 0, outOffset = 0, outBytes = 0;
    bool copyBack = true;  // false: the output is scratch here (a reduce's non-root)
  };
  // Runs chunk `index` on the pinned copies (in: the chunk's input, out: its output).
  using HostOp = std::function<void(const uint8_t* in, uint8_t* out, size_t index)>;

  // Throws ecclSystemError naming the reason when there is no CUDA driver.
  explicit StreamProxy(Communicator& comm);
  ~StreamProxy();
  StreamProxy(const StreamProxy&) = delete;
  StreamProxy& operator=(const StreamProxy&) = delete;

  // Enqueues an op on `stream` (in/out: device pointers; either may be null
  // when its chunks have no bytes). `what` names the op in errors.
  void enqueue(CUstream stream, const void* in, void* out, std::vector<Chunk> chunks, HostOp op,
               const std::string& what);
  // Waits until every op enqueued so far has run on the host (a host-buffer
  // call on the same communicator comes after them); throws at the deadline.
  void drain(Deadline deadline);
  // The communicator was aborted: destruction does not wait for pending
  // ops (their host collectives fail at once; ops the GPU has not reached
  // yet are dropped, and their memory is left to the process).
  void abandon() { abandoned_ = true; }

  // The chunk size of pipelined ops (ECCL_GPU_CHUNK_BYTES).
  static size_t chunkBytes();

 private:
  struct Staging;  // a pinned buffer, reused once its op's copies are done
  struct Job;
  struct Shared;   // outlives the proxy while the GPU may still call back
  static void onStaged(void* job);
  static void onReleased(void* staging);
  void run();
  void allocateFlag();
  void enqueueChunk(CUstream stream, const void* in, uint8_t* host, const std::vector<Chunk>& chunks, size_t i,
                    uint32_t ticket, const std::shared_ptr<HostOp>& op, const std::shared_ptr<Staging>& staging,
                    size_t outBase, const std::string& what);
  std::shared_ptr<Staging> takeStaging(size_t bytes);

  Communicator& comm_;
  const CudaDriver& cuda_;
  std::shared_ptr<Shared> shared_;
  std::thread thread_;
  bool abandoned_ = false;
};

}  // namespace eccl::gpu
