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
  // A buffer an op reads: device memory copied in on the stream, or host
  // memory (a small table) copied when the op is enqueued.
  struct Input {
    const void* data = nullptr;
    size_t bytes = 0;
    bool onHost = false;
  };
  // A device buffer an op writes; data == nullptr: scratch, not copied back
  // (a reduce's output on a rank that is not the root).
  struct Output {
    void* data = nullptr;
    size_t bytes = 0;
  };
  // One part of an op that runs as its own host collective: its byte ranges
  // within the op's inputs and outputs, each side laid out as packedOffsets
  // places its buffers.
  struct Chunk {
    size_t inOffset = 0, inBytes = 0, outOffset = 0, outBytes = 0;
  };
  // Runs chunk `index` on the pinned copies (in: the chunk's input, out: its output).
  using HostOp = std::function<void(const uint8_t* in, uint8_t* out, size_t index)>;
  struct Op {
    std::vector<Input> inputs;
    std::vector<Output> outputs;
    std::vector<Chunk> chunks;  // empty: one chunk of everything
    HostOp run;
    std::string what;                 // names the op in errors
    std::vector<CUstream> alsoOn;     // further streams the op is ordered on (a group's)
  };

  // Throws ecclSystemError naming the reason when there is no CUDA driver.
  explicit StreamProxy(Communicator& comm);
  ~StreamProxy();
  StreamProxy(const StreamProxy&) = delete;
  StreamProxy& operator=(const StreamProxy&) = delete;

  // Where each buffer of `bytes` starts when they are packed one after the
  // other, each aligned for any element type; the last entry is the total.
  static std::vector<size_t> packedOffsets(const std::vector<size_t>& bytes);
  template <typename Buffer>
  static std::vector<size_t> sizesOf(const std::vector<Buffer>& buffers) {
    std::vector<size_t> sizes;
    for (const Buffer& b : buffers) sizes.push_back(b.bytes);
    return sizes;
  }

  // Enqueues `op` on `stream` (and orders it on op.alsoOn: it starts after
  // their earlier work, their later work waits for it).
  void enqueue(CUstream stream, Op op);
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
  void stageChunk(CUstream stream, const Op& op, const std::vector<size_t>& inAt, uint8_t* host, size_t i,
                  uint32_t ticket, const std::shared_ptr<HostOp>& run, const std::shared_ptr<Staging>& staging,
                  size_t outBase);
  std::shared_ptr<Staging> takeStaging(size_t bytes);

  Communicator& comm_;
  const CudaDriver& cuda_;
  std::shared_ptr<Shared> shared_;
  std::thread thread_;
  bool abandoned_ = false;
};

}  // namespace eccl::gpu
