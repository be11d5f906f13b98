#include "tests/support/host_cuda/host_cuda.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

namespace {

using Result = int;
constexpr Result kSuccess = 0, kInvalidValue = 1;
using DevicePtr = unsigned long long;

// A stream: one thread running its commands in order.
class Stream {
 public:
  Stream() : worker_([this] { run(); }) {}
  ~Stream() {
    synchronize();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  void enqueue(std::function<void()> command) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(command));
      ++enqueued_;
    }
    cv_.notify_all();
  }
  void synchronize() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t target = enqueued_;
    cv_.wait(lock, [&] { return done_ >= target; });
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      auto command = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      command();
      lock.lock();
      ++done_;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t enqueued_ = 0, done_ = 0;
  bool stopping_ = false;
  std::thread worker_;
};

struct Event {
  std::atomic<uint64_t> recorded{0}, completed{0};
};

struct State {
  std::mutex mu;
  std::map<uintptr_t, size_t> device;  // base -> bytes
  Stream* legacy = nullptr;
};
State& state() {
  static State* s = new State;  // never destroyed: streams may run at exit
  return *s;
}

// The legacy default stream (1) and the per-thread one (2) are one stream here.
Stream* streamOf(void* handle) {
  if (reinterpret_cast<uintptr_t>(handle) <= 2) {
    std::lock_guard<std::mutex> lock(state().mu);
    if (!state().legacy) state().legacy = new Stream;
    return state().legacy;
  }
  return static_cast<Stream*>(handle);
}

bool isDevice(const void* p) {
  std::lock_guard<std::mutex> lock(state().mu);
  auto it = state().device.upper_bound(reinterpret_cast<uintptr_t>(p));
  if (it == state().device.begin()) return false;
  --it;
  return reinterpret_cast<uintptr_t>(p) < it->first + std::max<size_t>(it->second, 1);
}

void* allocate(size_t bytes) {
  void* p = std::aligned_alloc(256, (std::max<size_t>(bytes, 1) + 255) / 256 * 256);
  std::lock_guard<std::mutex> lock(state().mu);
  state().device[reinterpret_cast<uintptr_t>(p)] = bytes;
  return p;
}

void release(void* p) {
  {
    std::lock_guard<std::mutex> lock(state().mu);
    state().device.erase(reinterpret_cast<uintptr_t>(p));
  }
  std::free(p);
}

}  // namespace

extern "C" {

Result cuInit(unsigned) { return kSuccess; }

Result cuGetErrorString(Result error, const char** text) {
  *text = error == kInvalidValue ? "invalid value (host emulation)" : "error (host emulation)";
  return kSuccess;
}

Result cuPointerGetAttribute(void* data, int attribute, DevicePtr ptr) {
  if (attribute != 2 || !isDevice(reinterpret_cast<void*>(ptr))) return kInvalidValue;
  *static_cast<unsigned*>(data) = 2;  // CU_MEMORYTYPE_DEVICE
  return kSuccess;
}

Result cuMemHostAlloc(void** p, size_t bytes, unsigned) {
  *p = std::aligned_alloc(4096, (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096);
  return *p ? kSuccess : kInvalidValue;
}

Result cuMemFreeHost(void* p) {
  std::free(p);
  return kSuccess;
}

Result cuMemHostGetDevicePointer_v2(DevicePtr* d, void* p, unsigned) {
  *d = reinterpret_cast<DevicePtr>(p);
  return kSuccess;
}

Result cuMemcpyDtoHAsync_v2(void* dst, DevicePtr src, size_t bytes, void* stream) {
  if (!isDevice(reinterpret_cast<void*>(src))) return kInvalidValue;
  streamOf(stream)->enqueue([=] { std::memcpy(dst, reinterpret_cast<void*>(src), bytes); });
  return kSuccess;
}

Result cuMemcpyHtoDAsync_v2(DevicePtr dst, const void* src, size_t bytes, void* stream) {
  if (!isDevice(reinterpret_cast<void*>(dst))) return kInvalidValue;
  streamOf(stream)->enqueue([=] { std::memcpy(reinterpret_cast<void*>(dst), src, bytes); });
  return kSuccess;
}

Result cuLaunchHostFunc(void* stream, void (*fn)(void*), void* data) {
  streamOf(stream)->enqueue([=] { fn(data); });
  return kSuccess;
}

// CU_STREAM_WAIT_VALUE_GEQ: (int32_t)(*addr - value) >= 0.
Result cuStreamWaitValue32_v2(void* stream, DevicePtr addr, uint32_t value, unsigned flags) {
  if (flags != 0) return kInvalidValue;
  streamOf(stream)->enqueue([=] {
    auto* word = reinterpret_cast<volatile uint32_t*>(addr);
    while (static_cast<int32_t>(__atomic_load_n(word, __ATOMIC_ACQUIRE) - value) < 0)
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  });
  return kSuccess;
}

Result cuStreamGetCtx(void*, void** ctx) {
  *ctx = reinterpret_cast<void*>(uintptr_t{0x1000});
  return kSuccess;
}
Result cuCtxPushCurrent_v2(void*) { return kSuccess; }
Result cuCtxPopCurrent_v2(void** ctx) {
  if (ctx) *ctx = nullptr;
  return kSuccess;
}

Result cuEventCreate(void** event, unsigned) {
  *event = new std::shared_ptr<Event>(std::make_shared<Event>());
  return kSuccess;
}

Result cuEventRecord(void* event, void* stream) {
  auto e = *static_cast<std::shared_ptr<Event>*>(event);
  const uint64_t n = ++e->recorded;
  streamOf(stream)->enqueue([e, n] { e->completed.store(n); });
  return kSuccess;
}

Result cuStreamWaitEvent(void* stream, void* event, unsigned) {
  auto e = *static_cast<std::shared_ptr<Event>*>(event);
  const uint64_t n = e->recorded.load();
  streamOf(stream)->enqueue([e, n] {
    while (e->completed.load() < n) std::this_thread::sleep_for(std::chrono::microseconds(20));
  });
  return kSuccess;
}

Result cuEventDestroy_v2(void* event) {
  delete static_cast<std::shared_ptr<Event>*>(event);  // pending waits hold their own reference
  return kSuccess;
}

Result cuMemAllocAsync(DevicePtr* d, size_t bytes, void*) {
  *d = reinterpret_cast<DevicePtr>(allocate(bytes));
  return kSuccess;
}

Result cuMemFreeAsync(DevicePtr d, void* stream) {
  if (!isDevice(reinterpret_cast<void*>(d))) return kInvalidValue;
  streamOf(stream)->enqueue([d] { release(reinterpret_cast<void*>(d)); });
  return kSuccess;
}

Result cuStreamSynchronize(void* stream) {
  streamOf(stream)->synchronize();
  return kSuccess;
}

void* hostCudaMalloc(size_t bytes) { return allocate(bytes); }
void hostCudaFree(void* p) { release(p); }
void* hostCudaStreamCreate(void) { return new Stream; }
int hostCudaStreamSynchronize(void* stream) {
  streamOf(stream)->synchronize();
  return kSuccess;
}
void hostCudaStreamDestroy(void* stream) { delete static_cast<Stream*>(stream); }
int hostCudaMemcpyAsync(void* dst, const void* src, size_t bytes, void* stream) {
  streamOf(stream)->enqueue([=] { std::memcpy(dst, src, bytes); });
  return kSuccess;
}

}  // extern "C"
