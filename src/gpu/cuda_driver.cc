#include "gpu/cuda_driver.h"

#include <dlfcn.h>

#include <mutex>

#include "common/error.h"
#include "common/params.h"

namespace eccl::gpu {
namespace {

struct Loaded {
  CudaDriver driver{};
  bool ok = false;
  std::string why;
};

template <typename F>
bool resolve(void* lib, F*& slot, std::initializer_list<const char*> names, std::string* why) {
  for (const char* name : names)
    if (void* f = dlsym(lib, name)) {
      slot = reinterpret_cast<F*>(f);
      return true;
    }
  *why = fmt::format("the CUDA driver lacks {}", *names.begin());
  return false;
}

Loaded load() {
  Loaded l;
  const std::string path = params::cudaDriverLibrary();
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    l.why = fmt::format("no CUDA driver ({} cannot be loaded)", path);
    return l;
  }
  CudaDriver& d = l.driver;
  bool all = resolve(lib, d.init, {"cuInit"}, &l.why) &&
             resolve(lib, d.getErrorString, {"cuGetErrorString"}, &l.why) &&
             resolve(lib, d.pointerGetAttribute, {"cuPointerGetAttribute"}, &l.why) &&
             resolve(lib, d.memHostAlloc, {"cuMemHostAlloc"}, &l.why) &&
             resolve(lib, d.memFreeHost, {"cuMemFreeHost"}, &l.why) &&
             resolve(lib, d.memHostGetDevicePointer, {"cuMemHostGetDevicePointer_v2"}, &l.why) &&
             resolve(lib, d.memcpyDtoHAsync, {"cuMemcpyDtoHAsync_v2"}, &l.why) &&
             resolve(lib, d.memcpyHtoDAsync, {"cuMemcpyHtoDAsync_v2"}, &l.why) &&
             resolve(lib, d.launchHostFunc, {"cuLaunchHostFunc"}, &l.why) &&
             resolve(lib, d.streamWaitValue32, {"cuStreamWaitValue32_v2", "cuStreamWaitValue32"}, &l.why) &&
             resolve(lib, d.streamGetCtx, {"cuStreamGetCtx"}, &l.why) &&
             resolve(lib, d.ctxPushCurrent, {"cuCtxPushCurrent_v2"}, &l.why) &&
             resolve(lib, d.ctxPopCurrent, {"cuCtxPopCurrent_v2"}, &l.why) &&
             resolve(lib, d.eventCreate, {"cuEventCreate"}, &l.why) &&
             resolve(lib, d.eventRecord, {"cuEventRecord"}, &l.why) &&
             resolve(lib, d.streamWaitEvent, {"cuStreamWaitEvent"}, &l.why) &&
             resolve(lib, d.eventDestroy, {"cuEventDestroy_v2"}, &l.why) &&
             resolve(lib, d.memAllocAsync, {"cuMemAllocAsync"}, &l.why) &&
             resolve(lib, d.memFreeAsync, {"cuMemFreeAsync"}, &l.why) &&
             resolve(lib, d.streamSynchronize, {"cuStreamSynchronize"}, &l.why);
  if (!all) return l;
  if (CUresult r = d.init(0); r != 0) {
    const char* text = nullptr;
    d.getErrorString(r, &text);
    l.why = fmt::format("cuInit failed: {} (no usable GPU)", text ? text : "unknown error");
    return l;
  }
  l.ok = true;
  return l;
}

const Loaded& loaded() {
  static const Loaded l = load();
  return l;
}

}  // namespace

void CudaDriver::check(CUresult result, const char* what) const {
  if (result == 0) return;
  const char* text = nullptr;
  getErrorString(result, &text);
  fail(ecclSystemError, "{}: CUDA error {} ({})", what, result, text ? text : "unknown");
}

void CudaDriver::streamAfter(CUstream waiter, CUstream producer) const {
  if (waiter == producer) return;
  CUevent event = nullptr;
  check(eventCreate(&event, kEventDisableTiming), "creating an event to order two streams");
  CUresult recorded = eventRecord(event, producer);
  CUresult waited = recorded == 0 ? streamWaitEvent(waiter, event, 0) : recorded;
  // Destroying an event a stream still waits on is allowed: it is released once the wait is done.
  eventDestroy(event);
  check(waited, "ordering one stream after another");
}

StreamContext::StreamContext(const CudaDriver& cuda, CUstream stream) : cuda_(cuda) {
  // CU_STREAM_LEGACY and CU_STREAM_PER_THREAD belong to the current context.
  if (reinterpret_cast<uintptr_t>(stream) <= 2) return;
  CUcontext ctx = nullptr;
  cuda_.check(cuda_.streamGetCtx(stream, &ctx), "finding the stream's CUDA context");
  cuda_.check(cuda_.ctxPushCurrent(ctx), "making the stream's CUDA context current");
  pushed_ = true;
}

StreamContext::~StreamContext() {
  CUcontext ignored = nullptr;
  if (pushed_) cuda_.ctxPopCurrent(&ignored);
}

const CudaDriver* cudaDriver(std::string* why) {
  const Loaded& l = loaded();
  if (!l.ok && why) *why = l.why;
  return l.ok ? &l.driver : nullptr;
}

bool isDeviceMemory(const void* p) {
  const CudaDriver* d = cudaDriver();
  if (!d || !p) return false;
  unsigned type = 0;
  // Host memory the driver does not know answers with an error: host.
  if (d->pointerGetAttribute(&type, CudaDriver::kPointerAttributeMemoryType,
                             reinterpret_cast<CUdeviceptr>(p)) != 0)
    return false;
  return type == CudaDriver::kMemoryTypeDevice || type == CudaDriver::kMemoryTypeUnified;
}

void copyToHost(void* host, const void* device, size_t bytes, const char* what) {
  std::string why;
  const CudaDriver* d = cudaDriver(&why);
  if (!d) fail(ecclSystemError, "{}: a device buffer without a CUDA driver: {}", what, why);
  d->check(d->memcpyDtoHAsync(host, reinterpret_cast<CUdeviceptr>(device), bytes, nullptr), what);
  d->check(d->streamSynchronize(nullptr), what);
}

void copyToDevice(void* device, const void* host, size_t bytes, const char* what) {
  std::string why;
  const CudaDriver* d = cudaDriver(&why);
  if (!d) fail(ecclSystemError, "{}: a device buffer without a CUDA driver: {}", what, why);
  d->check(d->memcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(device), host, bytes, nullptr), what);
  d->check(d->streamSynchronize(nullptr), what);
}

}  // namespace eccl::gpu
