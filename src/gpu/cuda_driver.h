// The CUDA driver, loaded at run time (libcuda.so.1) so that libeccl has no
// link-time dependency on CUDA and runs unchanged where there is none. Only
// the calls the stream path needs; their types restate the driver's stable
// C ABI (cuda.h) so this compiles without the toolkit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace eccl::gpu {

using CUresult = int;
using CUstream = void*;
using CUdeviceptr = unsigned long long;
using CUhostFn = void (*)(void* userData);
using CUcontext = void*;
using CUevent = void*;

struct CudaDriver {
  CUresult (*init)(unsigned flags);
  CUresult (*getErrorString)(CUresult error, const char** text);
  CUresult (*pointerGetAttribute)(void* data, int attribute, CUdeviceptr ptr);
  CUresult (*memHostAlloc)(void** pp, size_t bytes, unsigned flags);
  CUresult (*memFreeHost)(void* p);
  CUresult (*memHostGetDevicePointer)(CUdeviceptr* dptr, void* p, unsigned flags);
  CUresult (*memcpyDtoHAsync)(void* dst, CUdeviceptr src, size_t bytes, CUstream stream);
  CUresult (*memcpyHtoDAsync)(CUdeviceptr dst, const void* src, size_t bytes, CUstream stream);
  CUresult (*launchHostFunc)(CUstream stream, CUhostFn fn, void* userData);
  CUresult (*streamWaitValue32)(CUstream stream, CUdeviceptr addr, uint32_t value, unsigned flags);
  CUresult (*streamGetCtx)(CUstream stream, CUcontext* ctx);
  CUresult (*ctxPushCurrent)(CUcontext ctx);
  CUresult (*ctxPopCurrent)(CUcontext* ctx);
  CUresult (*eventCreate)(CUevent* event, unsigned flags);
  CUresult (*eventRecord)(CUevent event, CUstream stream);
  CUresult (*streamWaitEvent)(CUstream stream, CUevent event, unsigned flags);
  CUresult (*eventDestroy)(CUevent event);
  CUresult (*memAllocAsync)(CUdeviceptr* dptr, size_t bytes, CUstream stream);
  CUresult (*memFreeAsync)(CUdeviceptr dptr, CUstream stream);
  CUresult (*streamSynchronize)(CUstream stream);

  // Constants of the driver ABI used here.
  static constexpr int kPointerAttributeMemoryType = 2;  // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
  static constexpr unsigned kMemoryTypeDevice = 2;       // CU_MEMORYTYPE_DEVICE
  static constexpr unsigned kMemoryTypeUnified = 4;      // CU_MEMORYTYPE_UNIFIED
  static constexpr unsigned kHostAllocPortable = 1;      // CU_MEMHOSTALLOC_PORTABLE
  static constexpr unsigned kHostAllocDeviceMap = 2;     // CU_MEMHOSTALLOC_DEVICEMAP
  static constexpr unsigned kWaitValueGeq = 0;           // CU_STREAM_WAIT_VALUE_GEQ
  static constexpr unsigned kEventDisableTiming = 2;     // CU_EVENT_DISABLE_TIMING

  // Later work on `waiter` waits for the work enqueued on `producer` so far.
  void streamAfter(CUstream waiter, CUstream producer) const;

  // Throws eccl::Error naming `what` and the driver's message unless ok.
  void check(CUresult result, const char* what) const;
};

// Makes the context of `stream` current on this thread for its lifetime:
// an op may be enqueued from a thread that never touched CUDA (a PyTorch
// worker, say). The legacy default stream uses the thread's own context.
class StreamContext {
 public:
  StreamContext(const CudaDriver& cuda, CUstream stream);
  ~StreamContext();
  StreamContext(const StreamContext&) = delete;
  StreamContext& operator=(const StreamContext&) = delete;

 private:
  const CudaDriver& cuda_;
  bool pushed_ = false;
};

// The loaded driver, or null with `why` set (no libcuda, no device, too old).
const CudaDriver* cudaDriver(std::string* why = nullptr);

// Blocking copies between host and device memory on the calling thread's
// default stream (snapshots of device buffers); throw naming `what`.
void copyToHost(void* host, const void* device, size_t bytes, const char* what);
void copyToDevice(void* device, const void* host, size_t bytes, const char* what);

// Whether `p` is device or managed memory; false for host memory and
// wherever there is no CUDA driver.
bool isDeviceMemory(const void* p);

}  // namespace eccl::gpu
