// Header-only; used by tests/net_plugin and perf/plugin_perf, never built into the plugin.
// Loads libnccl-net-eccl.so as NCCL does (dlopen, then dlsym of
// ncclNetPlugin_vN) and calls any version through one shape, the way
// NCCL's own loader adapts older tables.
#pragma once

#include <dlfcn.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "net_plugin/nccl_net_abi.h"

namespace eccl::test {

class NetApi {
 public:
  NetApi(const char* path, int version) : version_(version) {
    lib_ = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib_) throw std::runtime_error(std::string("dlopen: ") + dlerror());
    table_ = dlsym(lib_, ("ncclNetPlugin_v" + std::to_string(version)).c_str());
    if (!table_) throw std::runtime_error("no ncclNetPlugin_v" + std::to_string(version));
  }
  ~NetApi() { unload(); }
  void unload() {
    if (lib_) dlclose(lib_);
    lib_ = nullptr;
  }
  void* library() const { return lib_; }
  int version() const { return version_; }
  const char* name() const { return v8()->name; }

  ncclResult_t init(uint64_t commId = 1) {
    switch (version_) {
      case 8: return v8()->init(nullptr);
      case 9: return v9()->init(nullptr);
      case 10: return v10()->init(nullptr, nullptr);
      case 11: return v11()->init(&ctx_, commId, nullptr, nullptr, nullptr);
      default: return v12()->init(&ctx_, commId, nullptr, nullptr, nullptr);
    }
  }
  ncclResult_t finalize() {
    if (version_ == 11) return v11()->finalize(ctx_);
    if (version_ == 12) return v12()->finalize(ctx_);
    return ncclSuccess;
  }
  ncclResult_t devices(int* n) { return v8()->devices(n); }
  // Properties common to every version.
  ncclResult_t properties(int dev, ncclNetProperties_v8_t* common, int* maxRecvs) {
    union {
      ncclNetProperties_v8_t a;
      ncclNetProperties_v9_t b;
      ncclNetProperties_v11_t c;
      ncclNetProperties_v12_t d;
    } any;
    ncclResult_t rc;
    switch (version_) {
      case 8:
        rc = v8()->getProperties(dev, &any.a);
        *common = any.a;
        if (maxRecvs) *maxRecvs = any.a.maxRecvs;
        return rc;
      case 9: rc = v9()->getProperties(dev, &any.b); break;
      case 10: rc = v10()->getProperties(dev, &any.b); break;
      case 11: rc = v11()->getProperties(dev, &any.c); break;
      default: rc = v12()->getProperties(dev, &any.d); break;
    }
    *common = {any.b.name, any.b.pciPath, any.b.guid, any.b.ptrSupport, any.b.regIsGlobal, any.b.speed,
               any.b.port, any.b.latency, any.b.maxComms, any.b.maxRecvs, any.b.netDeviceType,
               any.b.netDeviceVersion};
    if (maxRecvs) *maxRecvs = any.b.maxRecvs;
    return rc;
  }
  ncclResult_t listen(void* handle, void** comm) {
    return version_ >= 11 ? (version_ == 11 ? v11()->listen(ctx_, 0, handle, comm) : v12()->listen(ctx_, 0, handle, comm))
                          : v8()->listen(0, handle, comm);
  }
  ncclResult_t connect(void* handle, void** comm) {
    ncclNetDeviceHandle_t* dev = nullptr;
    switch (version_) {
      case 8: return v8()->connect(0, handle, comm, &dev);
      case 9: return v9()->connect(0, handle, comm, &dev);
      case 10: return v10()->connect(0, nullptr, handle, comm, &dev);
      case 11: return v11()->connect(ctx_, 0, handle, comm, &dev);
      default: return v12()->connect(ctx_, 0, handle, comm, &dev);
    }
  }
  ncclResult_t accept(void* listenComm, void** comm) {
    ncclNetDeviceHandle_t* dev = nullptr;
    return v8()->accept(listenComm, comm, &dev);  // the same slot and shape in every version
  }
  ncclResult_t isend(void* comm, void* data, size_t size, int tag, void** request) {
    switch (version_) {
      case 8: return v8()->isend(comm, data, static_cast<int>(size), tag, nullptr, request);
      case 9: return v9()->isend(comm, data, size, tag, nullptr, request);
      case 10: return v10()->isend(comm, data, size, tag, nullptr, nullptr, request);
      case 11: return v11()->isend(comm, data, size, tag, nullptr, nullptr, request);
      default: return v12()->isend(comm, data, size, tag, nullptr, nullptr, request);
    }
  }
  ncclResult_t irecv(void* comm, int n, void** data, size_t* sizes, int* tags, void** request) {
    void* mh[8] = {};
    switch (version_) {
      case 8: {
        int narrow[8];
        for (int i = 0; i < n && i < 8; ++i) narrow[i] = static_cast<int>(sizes[i]);
        return v8()->irecv(comm, n, data, narrow, tags, mh, request);
      }
      case 9: return v9()->irecv(comm, n, data, sizes, tags, mh, request);
      case 10: return v10()->irecv(comm, n, data, sizes, tags, mh, mh, request);
      case 11: return v11()->irecv(comm, n, data, sizes, tags, mh, mh, request);
      default: return v12()->irecv(comm, n, data, sizes, tags, mh, mh, request);
    }
  }
  ncclResult_t iflush(void* comm, void** request) {
    void* data = nullptr;
    int size = 0;
    return v8()->iflush(comm, 1, &data, &size, nullptr, request);
  }
  ncclResult_t test(void* request, int* done, int* sizes) { return v8()->test(request, done, sizes); }
  ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mh) {
    return v8()->regMr(comm, data, size, type, mh);
  }
  ncclResult_t deregMr(void* comm, void* mh) { return v8()->deregMr(comm, mh); }
  ncclResult_t closeSend(void* comm) { return v8()->closeSend(comm); }
  ncclResult_t closeRecv(void* comm) { return v8()->closeRecv(comm); }
  ncclResult_t closeListen(void* comm) { return v8()->closeListen(comm); }
  // eccl's own counters: connections opened, connects over new lanes,
  // connects over pooled lanes, processes pooled.
  void stats(uint64_t out[4]) {
    auto fn = reinterpret_cast<int (*)(uint64_t*)>(dlsym(lib_, "ecclNetPluginStats"));
    if (!fn || fn(out) != 0) throw std::runtime_error("ecclNetPluginStats unavailable");
  }

 private:
  // Every version shares the first slots (name to closeListen) with v8's
  // layout except where the adapters above pick the version's own.
  const ncclNet_v8_t* v8() const { return static_cast<const ncclNet_v8_t*>(table_); }
  const ncclNet_v9_t* v9() const { return static_cast<const ncclNet_v9_t*>(table_); }
  const ncclNet_v10_t* v10() const { return static_cast<const ncclNet_v10_t*>(table_); }
  const ncclNet_v11_t* v11() const { return static_cast<const ncclNet_v11_t*>(table_); }
  const ncclNet_v12_t* v12() const { return static_cast<const ncclNet_v12_t*>(table_); }

  int version_;
  void* lib_ = nullptr;
  void* table_ = nullptr;
  void* ctx_ = nullptr;
};

}  // namespace eccl::test
