#include "gpu/stream_proxy.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "common/copy.h"
#include "common/error.h"
#include "common/log.h"
#include "common/mutex.h"
#include "common/params.h"

namespace eccl::gpu {

struct StreamProxy::Staging {
  void* host = nullptr;
  size_t bytes = 0;
  bool busy = false;  // guarded by Shared::mu
  Shared* shared = nullptr;
};

struct StreamProxy::Job {
  uint32_t ticket = 0;
  size_t index = 0;
  Chunk chunk;
  std::shared_ptr<HostOp> op;
  std::shared_ptr<Staging> staging;
  size_t outBase = 0;  // where outputs start in the staging buffer
  std::string what;
  std::shared_ptr<Shared> shared;
};

// What the GPU's host functions touch. The proxy thread and the callbacks
// share it; it lives until the last of them lets go, so a callback that
// fires after the communicator is gone finds a stopped state, not freed
// memory.
struct StreamProxy::Shared {
  Mutex mu;
  CondVar cv;
  bool stopping ECCL_GUARDED_BY(mu) = false;
  uint32_t nextTicket ECCL_GUARDED_BY(mu) = 0;  // last ticket handed out
  uint32_t doneTicket ECCL_GUARDED_BY(mu) = 0;  // last ticket run
  std::map<uint32_t, std::unique_ptr<Job>> ready ECCL_GUARDED_BY(mu);  // staged, by ticket
  std::vector<std::shared_ptr<Staging>> pool ECCL_GUARDED_BY(mu);
  // Mapped pinned word the GPU waits on; the thread stores each finished ticket.
  volatile uint32_t* flag ECCL_GUARDED_BY(mu) = nullptr;
  CUdeviceptr flagOnDevice ECCL_GUARDED_BY(mu) = 0;
};

size_t StreamProxy::chunkBytes() { return static_cast<size_t>(std::max<int64_t>(params::gpuChunkBytes(), 4096)); }

StreamProxy::StreamProxy(Communicator& comm)
    : comm_(comm), cuda_([] {
        std::string why;
        const CudaDriver* d = cudaDriver(&why);
        if (!d) fail(ecclSystemError, "device buffers need a CUDA driver and GPU: {}", why);
        return std::cref(*d);
      }()),
      shared_(std::make_shared<Shared>()) {
  thread_ = std::thread([this] { run(); });
}

// Allocated with the first op, in its stream's context; portable, so any
// context's streams can wait on it.
void StreamProxy::allocateFlag() {
  MutexLock lock(shared_->mu);
  if (shared_->flag) return;
  void* word = nullptr;
  cuda_.check(cuda_.memHostAlloc(&word, 64, CudaDriver::kHostAllocPortable | CudaDriver::kHostAllocDeviceMap),
              "allocating the stream flag");
  std::memset(word, 0, 64);
  cuda_.check(cuda_.memHostGetDevicePointer(&shared_->flagOnDevice, word, 0), "mapping the stream flag");
  shared_->flag = static_cast<volatile uint32_t*>(word);
}

StreamProxy::~StreamProxy() {
  bool drained = true;
  try {
    drain(abandoned_ ? Clock::now() : deadlineAfterMs(params::timeoutMs()));
  } catch (const Error& e) {
    drained = false;
    if (!abandoned_) log::warn("stream work still pending at destruction: {}", e.what());
  }
  {
    MutexLock lock(shared_->mu);
    shared_->stopping = true;
    shared_->cv.notifyAll();
  }
  thread_.join();
  // Memory a stream may still touch is left to the process rather than
  // freed under the GPU.
  if (!drained) return;
  MutexLock lock(shared_->mu);
  for (auto& s : shared_->pool) cuda_.memFreeHost(s->host);
  shared_->pool.clear();
  if (shared_->flag) cuda_.memFreeHost(const_cast<uint32_t*>(shared_->flag));
}

// Pinned memory costs a system call and page locking: buffers are reused
// once the stream is past their copy-back. Called on the caller's thread
// (CUDA calls are allowed there, never in the stream's host functions).
std::shared_ptr<StreamProxy::Staging> StreamProxy::takeStaging(size_t bytes) {
  MutexLock lock(shared_->mu);
  std::shared_ptr<Staging> best;
  for (auto& s : shared_->pool)
    if (!s->busy && s->bytes >= bytes && (!best || s->bytes < best->bytes)) best = s;
  if (!best) {
    // Idle buffers too small for this op go, so the pool does not grow
    // with every larger op.
    std::erase_if(shared_->pool, [this](const std::shared_ptr<Staging>& s) {
      if (s->busy) return false;
      cuda_.memFreeHost(s->host);
      return true;
    });
    best = std::make_shared<Staging>();
    best->bytes = std::max<size_t>(bytes, 1);
    best->shared = shared_.get();
    cuda_.check(cuda_.memHostAlloc(&best->host, best->bytes, CudaDriver::kHostAllocPortable),
                "allocating pinned staging memory");
    shared_->pool.push_back(best);
  }
  best->busy = true;
  return best;
}

std::vector<size_t> StreamProxy::packedOffsets(const std::vector<size_t>& bytes) {
  constexpr size_t kAlign = 64;
  std::vector<size_t> at{0};
  for (size_t b : bytes) at.push_back(at.back() + (b + kAlign - 1) / kAlign * kAlign);
  return at;
}

namespace {

// Calls `copy(offsetInBuffer, offsetInPacked, bytes, buffer)` for each part
// of the packed range [from, from + bytes) that falls in a buffer.
template <typename F>
void forEachOverlap(const std::vector<size_t>& at, const std::vector<size_t>& sizes, size_t from, size_t bytes, F copy) {
  for (size_t b = 0; b < sizes.size(); ++b) {
    size_t lo = std::max(from, at[b]), hi = std::min(from + bytes, at[b] + sizes[b]);
    if (lo < hi) copy(lo - at[b], lo, hi - lo, b);
  }
}

}  // namespace

void StreamProxy::enqueue(CUstream stream, Op op) {
  StreamContext context(cuda_, stream);
  allocateFlag();
  const auto inSizes = sizesOf(op.inputs), outSizes = sizesOf(op.outputs);
  const auto inAt = packedOffsets(inSizes), outAt = packedOffsets(outSizes);
  const size_t inBytes = inAt.back();
  if (op.chunks.empty()) op.chunks.push_back({0, inBytes, 0, outAt.back()});
  for (CUstream other : op.alsoOn) cuda_.streamAfter(stream, other);
  auto staging = takeStaging(inBytes + outAt.back());
  auto* host = static_cast<uint8_t*>(staging->host);
  // Host tables are read now: the caller may reuse them once the call returns.
  for (size_t b = 0; b < op.inputs.size(); ++b)
    if (op.inputs[b].onHost && op.inputs[b].bytes) copyBytes(host + inAt[b], op.inputs[b].data, op.inputs[b].bytes);
  auto run = std::make_shared<HostOp>(std::move(op.run));
  std::vector<uint32_t> tickets;
  CUdeviceptr flag = 0;
  {
    MutexLock lock(shared_->mu);
    for (size_t i = 0; i < op.chunks.size(); ++i) tickets.push_back(++shared_->nextTicket);
    flag = shared_->flagOnDevice;
  }
  // In: every chunk's copy, each followed by the host function that hands
  // it over, so chunk 0 is on the network while chunk 1 is still copying.
  size_t handed = 0;
  try {
    for (; handed < op.chunks.size(); ++handed) stageChunk(stream, op, inAt, host, handed, tickets[handed], run, staging, inBytes);
  } catch (...) {
    // Tickets taken but never handed over would stop every later op: they
    // pass as ops with nothing to run.
    MutexLock lock(shared_->mu);
    for (size_t i = handed; i < op.chunks.size(); ++i) {
      auto skip = std::make_unique<Job>();
      skip->ticket = tickets[i];
      shared_->ready.emplace(skip->ticket, std::move(skip));
    }
    shared_->cv.notifyAll();
    throw;
  }
  // Out: each chunk waits for its collective, then copies back.
  for (size_t i = 0; i < op.chunks.size(); ++i) {
    const Chunk& c = op.chunks[i];
    cuda_.check(cuda_.streamWaitValue32(stream, flag, tickets[i], CudaDriver::kWaitValueGeq),
                "enqueueing the wait for a chunk");
    forEachOverlap(outAt, outSizes, c.outOffset, c.outBytes, [&](size_t at, size_t packed, size_t n, size_t b) {
      if (!op.outputs[b].data) return;
      cuda_.check(cuda_.memcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(op.outputs[b].data) + at, host + inBytes + packed,
                                        n, stream),
                  "copying an output chunk back to the device");
    });
  }
  cuda_.check(cuda_.launchHostFunc(stream, &StreamProxy::onReleased, staging.get()), "enqueueing the release");
  for (CUstream other : op.alsoOn) cuda_.streamAfter(other, stream);
}

void StreamProxy::stageChunk(CUstream stream, const Op& op, const std::vector<size_t>& inAt, uint8_t* host, size_t i,
                             uint32_t ticket, const std::shared_ptr<HostOp>& run,
                             const std::shared_ptr<Staging>& staging, size_t outBase) {
  const Chunk& c = op.chunks[i];
  forEachOverlap(inAt, sizesOf(op.inputs), c.inOffset, c.inBytes, [&](size_t at, size_t packed, size_t n, size_t b) {
    if (op.inputs[b].onHost) return;
    cuda_.check(cuda_.memcpyDtoHAsync(host + packed, reinterpret_cast<CUdeviceptr>(op.inputs[b].data) + at, n, stream),
                "copying an input chunk to pinned memory");
  });
  auto job = std::make_unique<Job>();
  job->ticket = ticket;
  job->index = i;
  job->chunk = c;
  job->op = run;
  job->staging = staging;
  job->outBase = outBase;
  job->what = op.what;
  job->shared = shared_;
  cuda_.check(cuda_.launchHostFunc(stream, &StreamProxy::onStaged, job.get()), "enqueueing the host side");
  job.release();  // the host function owns it now
}

// On the GPU's callback thread: no CUDA calls, no blocking; hand over.
void StreamProxy::onStaged(void* p) {
  std::unique_ptr<Job> job(static_cast<Job*>(p));
  auto shared = job->shared;
  MutexLock lock(shared->mu);
  if (shared->stopping) return;
  shared->ready.emplace(job->ticket, std::move(job));
  shared->cv.notifyAll();
}

void StreamProxy::onReleased(void* p) {
  auto* staging = static_cast<Staging*>(p);
  MutexLock lock(staging->shared->mu);
  staging->busy = false;
}

// Runs the staged chunks in ticket order, the order the calls were made,
// which every rank shares; each chunk raises the flag, failed or not.
void StreamProxy::run() {
  for (;;) {
    std::unique_ptr<Job> job;
    {
      MutexLock lock(shared_->mu);
      for (;;) {
        if (shared_->stopping) return;
        auto it = shared_->ready.find(shared_->doneTicket + 1);
        if (it != shared_->ready.end()) {
          job = std::move(it->second);
          shared_->ready.erase(it);
          break;
        }
        shared_->cv.wait(shared_->mu);
      }
    }
    try {
      if (!job->op) throw Error(ecclSystemError, "the op could not be enqueued on its stream");
      auto* host = static_cast<uint8_t*>(job->staging->host);
      // This thread is the communicator's caller while the op runs: entry
      // points drain this queue before they take the role (api::Entered).
      CallerTurn turn(comm_.callerRole());
      (*job->op)(host + job->chunk.inOffset, host + job->outBase + job->chunk.outOffset, job->index);
    } catch (const Error& e) {
      comm_.recordAsyncError(e.code(), fmt::format("{} (stream-ordered, chunk {}): {}", job->what, job->index, e.what()));
    } catch (const std::exception& e) {
      comm_.recordAsyncError(ecclInternalError, fmt::format("{} (stream-ordered): {}", job->what, e.what()));
    }
    MutexLock lock(shared_->mu);
    shared_->doneTicket = job->ticket;
    if (shared_->flag) __atomic_store_n(const_cast<uint32_t*>(shared_->flag), job->ticket, __ATOMIC_RELEASE);
    shared_->cv.notifyAll();
  }
}

void StreamProxy::drain(Deadline deadline) {
  MutexLock lock(shared_->mu);
  const uint32_t target = shared_->nextTicket;
  while (static_cast<int32_t>(shared_->doneTicket - target) < 0)
    if (!shared_->cv.waitUntil(shared_->mu, deadline) && Clock::now() >= deadline)
      fail(ecclTimeout, "stream-ordered ops up to {} not run before the deadline (done: {}): is the GPU stream stuck?",
           target, shared_->doneTicket);
}

}  // namespace eccl::gpu
